import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { freemem } from 'node:os';
import { pipeline } from 'node:stream/promises';
import { timingSafeEqual } from 'node:crypto';

import { toVsnapError, VsnapError, type ErrorCode } from '../errors.js';
import { captureEngine } from '../snapshot/engine-flows.js';
import type { RegionStore } from '../store/region-store.js';
import type { SwapController } from './controller.js';

/**
 * Options of {@link SwapAgent.listen}.
 * @public
 */
export interface SwapAgentOptions {
  /** The controller whose engines it serves. */
  readonly controller: SwapController;
  /** The store of the engines' snapshots (for the control routes). */
  readonly store: RegionStore;
  /** Default 127.0.0.1. */
  readonly host?: string;
  /** Default 0 (any free port). */
  readonly port?: number;
  /** Bearer token of the control routes; without one they answer 503. */
  readonly controlToken?: string;
  /** Bearer token clients must send on /v1 routes (none: open). */
  readonly apiKey?: string;
  /** Largest request body accepted (default 32 MiB). */
  readonly maxBodyBytes?: number;
}

const STATUS: Partial<Record<ErrorCode, number>> = {
  E_UNKNOWN_MODEL: 404,
  E_BUSY: 503,
  E_TIMEOUT: 504,
  E_NOT_RESTORABLE: 409,
  E_INVALID_ARGUMENT: 400,
  E_ENGINE_UNREACHABLE: 502,
  E_ENGINE_HTTP: 502,
  E_SNAPSHOT_NOT_FOUND: 404,
  E_CLOSED: 503,
};

function send(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function sendError(res: ServerResponse, err: unknown): void {
  const e = toVsnapError(err);
  send(res, STATUS[e.code] ?? 500, { error: { message: e.message, type: e.code, code: e.code } });
}

function tokenMatches(header: string | undefined, token: string): boolean {
  const presented = Buffer.from((header ?? '').replace(/^Bearer\s+/i, ''));
  const expected = Buffer.from(token);
  return presented.length === expected.length && timingSafeEqual(presented, expected);
}

async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw new VsnapError('E_INVALID_ARGUMENT', `request body over ${limit} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/**
 * The HTTP agent (`vsnap serve`): an OpenAI-compatible proxy in front of the engines a
 * {@link SwapController} manages. `/v1/completions` and `/v1/chat/completions` go to the engine of
 * their `model`, woken as needed; answers (streamed ones too) pass through unbuffered.
 * `/v1/models` lists the models. Per-engine control routes in the vllm-snapshot style, behind a
 * bearer token: `POST /engines/:name/snapshot` (`?force=1`), `/suspend` (409 when not
 * restorable), `/restore`, `GET /engines/:name/snapshot_status`. Also `GET /metrics`
 * (Prometheus) and `GET /healthz`. Binds 127.0.0.1 unless told otherwise.
 * @public
 */
export class SwapAgent {
  /** Where it listens, e.g. `http://127.0.0.1:8080`. */
  readonly url: string;
  private readonly server: Server;

  private constructor(server: Server) {
    this.server = server;
    const a = server.address() as AddressInfo;
    this.url = `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** Starts listening. */
  static async listen(options: SwapAgentOptions): Promise<SwapAgent> {
    const server = createServer((req, res) => {
      handle(options, req, res).catch((err: unknown) => sendError(res, err));
    });
    server.keepAliveTimeout = 65_000;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => resolve());
    });
    return new SwapAgent(server);
  }

  /** Stops accepting connections and closes idle ones. */
  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeIdleConnections();
    });
  }
}

async function handle(options: SwapAgentOptions, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://agent');
  const path = url.pathname;
  const { controller } = options;
  if (req.method === 'GET' && path === '/healthz') return send(res, 200, { ok: true, engines: controller.states() });
  if (req.method === 'GET' && path === '/metrics') {
    const text = await controller.registry.metrics();
    res.writeHead(200, { 'content-type': controller.registry.contentType });
    res.end(text);
    return;
  }
  if (path.startsWith('/v1/')) {
    if (options.apiKey && !tokenMatches(req.headers.authorization, options.apiKey)) {
      return send(res, 401, { error: { message: 'missing or wrong API key', type: 'E_UNAUTHORIZED', code: 'E_UNAUTHORIZED' } });
    }
    if (req.method === 'GET' && path === '/v1/models') {
      return send(res, 200, { object: 'list', data: controller.models().map((id) => ({ id, object: 'model', owned_by: 'vsnap' })) });
    }
    if (req.method === 'POST' && (path === '/v1/completions' || path === '/v1/chat/completions')) return proxy(options, req, res, path);
    return send(res, 404, { error: { message: `no route ${req.method} ${path}`, type: 'E_NOT_FOUND', code: 'E_NOT_FOUND' } });
  }
  const control = /^\/engines\/([^/]+)\/(snapshot|suspend|restore|snapshot_status)$/.exec(path);
  if (control) {
    if (!options.controlToken) return send(res, 503, { error: { message: 'no control token is configured: the control routes are off', code: 'E_UNAUTHORIZED' } });
    if (!tokenMatches(req.headers.authorization, options.controlToken)) return send(res, 401, { error: { message: 'missing or wrong bearer token', code: 'E_UNAUTHORIZED' } });
    const name = decodeURIComponent(control[1]!);
    const action = control[2]!;
    const engine = controller.engine(name);
    const snapshotName = engine.snapshot ?? name;
    if (req.method === 'GET' && action === 'snapshot_status') {
      const states = controller.states().find((s) => s.name === name)!;
      const check = await controller.snapshotStatus(name); // a snapshot marked damaged by a failed restore included
      return send(res, 200, {
        is_sleeping: states.state !== 'awake',
        state: states.state,
        cached: check.cached,
        restorable: check.restorable,
        reason: check.problems.join('; ') || null,
        free_gib: Number((freemem() / 2 ** 30).toFixed(2)),
      });
    }
    if (req.method !== 'POST') return send(res, 405, { error: { message: `use POST for ${action}` } });
    if (action === 'suspend') {
      const event = await controller.suspend(name);
      return send(res, 200, { suspended: true, ...(event ? { seconds: event.seconds } : { already: true }) });
    }
    if (action === 'restore') {
      await controller.restore(name);
      return send(res, 200, { restored: true });
    }
    // snapshot: capture the engine (woken for it); ?force=1 captures again when one exists
    const existing = await options.store.current(snapshotName);
    if (existing && url.searchParams.get('force') !== '1') return send(res, 200, { cached: true, id: existing.id });
    const lease = await controller.acquire(name);
    try {
      const snap = await captureEngine(options.store, snapshotName, lease.client);
      return send(res, 200, { cached: false, id: snap.id, bytes: snap.manifest.totalBytes, seconds: snap.lastCapture?.seconds });
    } finally {
      lease.release();
    }
  }
  return send(res, 404, { error: { message: `no route ${req.method} ${path}` } });
}

async function proxy(options: SwapAgentOptions, req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
  const body = await readBody(req, options.maxBodyBytes ?? 32 * 1024 * 1024);
  let model: unknown;
  try {
    model = (JSON.parse(body.toString('utf8')) as { model?: unknown }).model;
  } catch {
    throw new VsnapError('E_INVALID_ARGUMENT', 'the body is not JSON');
  }
  if (typeof model !== 'string') throw new VsnapError('E_INVALID_ARGUMENT', 'the body needs a "model" string');
  const gone = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) gone.abort();
  });
  const lease = await options.controller.acquire(model, { signal: gone.signal });
  try {
    const upstream = await lease.client.forward({
      method: 'POST',
      path,
      headers: { 'content-type': req.headers['content-type'] ?? 'application/json', accept: req.headers.accept ?? '*/*' },
      body,
      signal: gone.signal,
    });
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(upstream.headers)) {
      if (v !== undefined && !['connection', 'keep-alive', 'transfer-encoding'].includes(k)) headers[k] = v;
    }
    headers['x-vsnap-engine'] = lease.engine;
    res.writeHead(upstream.statusCode, headers);
    await pipeline(upstream.body, res);
  } finally {
    lease.release();
  }
}
