import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { freemem, hostname } from 'node:os';
import { pipeline } from 'node:stream/promises';

import type { RamTier, RegionStore, StoreCodec, SwapController } from 'vsnap';

import { toVsnapError, VsnapError, type ErrorCode } from '../errors.js';
import { captureEngine } from '../flows/index.js';
import { bearerMatches, BodyBudget, decodeSegment, HostCheck, HttpError, readBody, requireJsonBody, send, sendError, watchWriteProgress } from './http.js';
import { modelOf } from './body-model.js';
import { StatusBoard } from './status/board.js';
import { STATUS_PAGE } from './status/page.js';
import type { ModelReadinessSource } from './model-readiness.js';
import type { Supervisor } from './supervisor.js';

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
  /**
   * Host names requests may carry in their `Host` header besides IP literals, loopback names
   * (`localhost`, `*.localhost`), `host` itself and, when `host` is a wildcard address, this
   * machine's host name: the names clients use to reach it (a load balancer's, say).
   * `.example.com` accepts its subdomains; `*` accepts any name (no DNS-rebinding protection).
   * Other names get 403 E_HOST_NOT_ALLOWED.
   */
  readonly allowedHosts?: readonly string[];
  /** Bearer token of the control routes; without one they answer 503. */
  readonly controlToken?: string;
  /** Bearer token clients must send on /v1 routes (none: open). */
  readonly apiKey?: string;
  /** Largest request body accepted (default 32 MiB); larger ones get 413 and the connection is closed. */
  readonly maxBodyBytes?: number;
  /**
   * Request-body bytes held at once across all requests (default 256 MiB): bytes count as they
   * arrive (a declared Content-Length reserves nothing); a body whose bytes arrive while it is
   * full gets 429.
   */
  readonly maxInFlightBodyBytes?: number;
  /**
   * How long a client may take to send a whole request, headers and body (default 120 s); then
   * 408 and the connection is closed, so a slow or stalled body cannot hold its bytes longer.
   */
  readonly requestTimeoutMs?: number;
  /** How long a client may take to send a request's headers (default 30 s, at most requestTimeoutMs). */
  readonly headersTimeoutMs?: number;
  /**
   * A request body that sends nothing for this long gets 408, and one that waits this long for
   * room in {@link SwapAgentOptions.maxInFlightBodyBytes} gets 429 (default 10 s): a stalled
   * sender holds its bytes for a bounded time, and a good client waits for them at most this long.
   */
  readonly bodyStallMs?: number;
  /**
   * A response with bytes waiting to be sent that sends none for this long is closed (default
   * 30 s): a client that stops reading cannot hold its engine (the lease of its request) longer.
   */
  readonly responseStallMs?: number;
  /**
   * Whether `/healthz` names the engines and `/metrics` answers without the control token.
   * Default: true without a control token, false with one (then `/healthz` says only ok or
   * degraded, and `/metrics` needs the token).
   */
  readonly publicStatus?: boolean;
  /** For the status page: the RAM tier. */
  readonly ram?: RamTier;
  /** How the snapshot route's captures write the store's blobs (default `off`, raw): vsnap's `CaptureOptions.codec`. */
  readonly codec?: StoreCodec;
  /** For the status page and `/healthz`: the supervisor of the engines `vsnap serve` started. */
  readonly supervisor?: Supervisor;
  /** For the status page: GPU budgets per device ordinal, bytes. */
  readonly budgets?: Readonly<Record<number, number>>;
  /**
   * Whether each model is ready (`vsnap serve` while its engines boot and snapshots are
   * pulled): requests and control actions for a model that is not get 503 E_NOT_READY with the
   * reason; `/healthz` and the status page show it.
   */
  readonly readiness?: ModelReadinessSource;
  /**
   * The operator's log: a failed request whose error has a cause (the detail clients are not
   * shown: paths, mismatches) is written here with it. Default: nothing is written.
   */
  readonly log?: (line: string) => void;
}

/**
 * The HTTP agent (`vsnap serve`): an OpenAI-compatible proxy in front of the engines a
 * `SwapController` (of `vsnap`) manages. `/v1/completions` and `/v1/chat/completions` go to the engine of
 * their `model`, woken as needed; answers (streamed ones too) pass through unbuffered.
 * `/v1/models` lists the models, `/v1/models/{id}` answers one (OpenAI's model object, or its 404 error). Per-engine control routes in the vllm-snapshot style, behind a
 * bearer token: `POST /engines/:name/snapshot` (`?force=1`), `/suspend` (409 when not
 * restorable), `/restore`, `GET /engines/:name/snapshot_status`. Also `GET /metrics`
 * (Prometheus), `GET /healthz` (`degraded` with the engines that failed or are down), and a
 * read-only status page at `GET /` (data at `/api/status`, live at `/api/events`, behind the control
 * token when one is set). Binds 127.0.0.1 unless told otherwise.
 * @public
 */
export class SwapAgent {
  /** Where it listens, e.g. `http://127.0.0.1:8080`. */
  readonly url: string;
  private readonly server: Server;
  private readonly board: StatusBoard;
  private readonly budget: BodyBudget;

  private constructor(server: Server, board: StatusBoard, budget: BodyBudget) {
    this.server = server;
    this.board = board;
    this.budget = budget;
    const a = server.address() as AddressInfo;
    this.url = `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** Starts listening. */
  static async listen(options: SwapAgentOptions): Promise<SwapAgent> {
    const ctx: AgentContext = {
      options,
      hosts: new HostCheck(options.host ?? '127.0.0.1', options.allowedHosts ?? [], hostname()),
      budget: new BodyBudget(options.maxInFlightBodyBytes ?? 256 * 1024 * 1024),
      board: new StatusBoard(options),
      publicStatus: options.publicStatus ?? !options.controlToken,
      created: Math.floor(Date.now() / 1000),
    };
    for (const key of ['bodyStallMs', 'responseStallMs', 'maxBodyBytes', 'maxInFlightBodyBytes', 'requestTimeoutMs', 'headersTimeoutMs'] as const) {
      const v = options[key];
      if (v !== undefined && !(Number.isFinite(v) && v > 0)) throw new VsnapError('E_INVALID_ARGUMENT', `SwapAgentOptions.${key} must be a positive number (got ${String(v)})`);
    }
    const requestTimeout = options.requestTimeoutMs ?? 120_000;
    const headersTimeout = Math.min(options.headersTimeoutMs ?? 30_000, requestTimeout);
    // Node checks the two timeouts every connectionsCheckingInterval: a fraction of the shorter one.
    const connectionsCheckingInterval = Math.max(10, Math.min(30_000, Math.floor(headersTimeout / 4)));
    const server = createServer({ requestTimeout, headersTimeout, connectionsCheckingInterval }, (req, res) => {
      handle(ctx, req, res).catch((err: unknown) => {
        const cause = err instanceof Error ? err.cause : undefined;
        if (cause !== undefined && options.log) options.log(`vsnap: ${req.method} ${req.url?.split('?')[0]} failed: ${(err as Error).message} (cause: ${cause instanceof Error ? cause.message : String(cause)})`);
        sendError(res, err, req.url?.startsWith('/v1/') === true);
      });
    });
    server.keepAliveTimeout = 65_000;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => resolve());
    });
    return new SwapAgent(server, ctx.board, ctx.budget);
  }

  /** @internal Request bodies being read now and the bytes they hold (tests, diagnostics). */
  bodyReads(): { readonly requests: number; readonly heldBytes: number; readonly waiting: number } {
    return { requests: this.budget.readingBodies, heldBytes: this.budget.heldBytes, waiting: this.budget.waitingBodies };
  }

  /**
   * Stops accepting connections, ends the status streams, closes idle connections and those
   * still sending a request body (nothing was answered on them), and waits for the requests
   * being answered: at most `graceMs` (default: as long as they take), then closes what is left.
   */
  async close(options: { readonly graceMs?: number } = {}): Promise<void> {
    this.board.close();
    let timer: NodeJS.Timeout | undefined;
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeIdleConnections();
      this.budget.dropUnfinished();
      if (options.graceMs !== undefined) timer = setTimeout(() => this.server.closeAllConnections(), options.graceMs);
    });
    clearTimeout(timer);
  }
}

interface AgentContext {
  readonly options: SwapAgentOptions;
  readonly hosts: HostCheck;
  readonly budget: BodyBudget;
  readonly board: StatusBoard;
  readonly publicStatus: boolean;
  /** When it started listening, in Unix seconds (the models' `created`). */
  readonly created: number;
}

/** OpenAI's model object; `created` is when this agent started (the models have no other date here). */
function modelObject(ctx: AgentContext, id: string): { id: string; object: 'model'; created: number; owned_by: string } {
  return { id, object: 'model', created: ctx.created, owned_by: 'vsnap' };
}

function requireControl(options: SwapAgentOptions, req: IncomingMessage): void {
  if (!options.controlToken) return;
  if (!bearerMatches(req.headers.authorization, options.controlToken)) throw new HttpError('E_UNAUTHORIZED', 'missing or wrong bearer token (send Authorization: Bearer <control token>)');
}

async function handle(ctx: AgentContext, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const { options, board } = ctx;
  let url: URL;
  try {
    url = new URL(req.url ?? '/', 'http://agent');
  } catch {
    throw new HttpError('E_BAD_REQUEST', 'the request target is not a valid path');
  }
  const path = url.pathname;
  // Before anything is read or answered: a name this agent is not reached by (DNS rebinding),
  // and a POST body that is not JSON (what a cross-site form or text/plain request sends).
  if (!ctx.hosts.allows(req.headers.host)) {
    const name = HostCheck.nameOf(req.headers.host ?? '');
    throw new HttpError(
      'E_HOST_NOT_ALLOWED',
      name === undefined
        ? `this agent does not answer to the Host header ${JSON.stringify(req.headers.host)}: it is not a host name (name[:port])`
        : `this agent does not answer to the host name ${JSON.stringify(name)} (Host: ${JSON.stringify(req.headers.host)}): add ${JSON.stringify(name)} (the name, without a port) to listen.allowedHosts`,
      true,
    );
  }
  if (req.method === 'POST') requireJsonBody(req);
  const { controller } = options;
  const get = req.method === 'GET' || req.method === 'HEAD';
  if (get && path === '/healthz') {
    const health = board.health();
    const authorized = ctx.publicStatus || (options.controlToken !== undefined && bearerMatches(req.headers.authorization, options.controlToken));
    return send(res, 200, authorized ? { ...health, engines: controller.states() } : { ok: health.ok, status: health.status });
  }
  if (get && path === '/metrics') {
    if (!ctx.publicStatus) {
      if (!options.controlToken) throw new HttpError('E_UNAUTHORIZED', 'metrics are private and no control token is configured');
      requireControl(options, req);
    }
    const text = await controller.registry.metrics();
    res.writeHead(200, { 'content-type': controller.registry.contentType });
    res.end(text);
    return;
  }
  if (get && (path === '/' || path === '/index.html')) {
    // frame-ancestors (and X-Frame-Options for older browsers): no other page can frame it (clickjacking)
    res.writeHead(200, {
      'content-type': 'text/html; charset=utf-8',
      'cache-control': 'no-store',
      'content-security-policy': "default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
      'x-frame-options': 'DENY',
      'x-content-type-options': 'nosniff',
    });
    res.end(STATUS_PAGE);
    return;
  }
  if (get && path === '/api/status') {
    requireControl(options, req);
    return send(res, 200, await board.snapshot());
  }
  if (req.method === 'GET' && path === '/api/events') {
    requireControl(options, req);
    return board.stream(req, res);
  }
  if (path.startsWith('/v1/')) {
    if (options.apiKey && !bearerMatches(req.headers.authorization, options.apiKey)) throw new HttpError('E_UNAUTHORIZED', 'missing or wrong API key (send Authorization: Bearer <api key>)');
    if (get && path === '/v1/models') {
      return send(res, 200, { object: 'list', data: controller.models().map((id) => modelObject(ctx, id)) });
    }
    if (get && path.startsWith('/v1/models/')) {
      // the id may hold slashes (`meta-llama/Llama-3.1-8B`), sent raw or percent-encoded
      const id = decodeSegment(path.slice('/v1/models/'.length));
      if (controller.models().includes(id)) return send(res, 200, modelObject(ctx, id));
      throw new VsnapError('E_UNKNOWN_MODEL', `The model '${id}' does not exist`); // OpenAI's model_not_found (sendError)
    }
    if (req.method === 'POST' && (path === '/v1/completions' || path === '/v1/chat/completions')) return proxy(ctx, req, res, path);
    throw new HttpError('E_NOT_FOUND', `no route ${req.method} ${path}`);
  }
  const control = /^\/engines\/([^/]+)\/(snapshot|suspend|restore|snapshot_status)$/.exec(path);
  if (control) {
    if (!options.controlToken) throw new HttpError('E_CONTROL_OFF', 'no control token is configured: the control routes are off (set controlToken in the configuration)');
    requireControl(options, req);
    const name = decodeSegment(control[1]!);
    const action = control[2]!;
    const engine = controller.engine(name);
    const snapshotName = engine.snapshot ?? name;
    if (action === 'snapshot_status') {
      if (!get) throw new HttpError('E_METHOD_NOT_ALLOWED', 'use GET for snapshot_status');
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
    if (req.method !== 'POST') throw new HttpError('E_METHOD_NOT_ALLOWED', `use POST for ${action}`);
    requireReady(options, name);
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
      const check = controller.engine(name).check;
      const snap = await captureEngine(options.store, snapshotName, lease.client, { ...(check ? { check } : {}), ...(options.codec ? { codec: options.codec } : {}) });
      return send(res, 200, { cached: false, id: snap.id, bytes: snap.manifest.totalBytes, seconds: snap.lastCapture?.seconds });
    } finally {
      lease.release();
    }
  }
  throw new HttpError('E_NOT_FOUND', `no route ${req.method} ${path}`);
}

/** A model `vsnap serve` is still booting (or whose boot failed) is refused with the reason, before any engine is asked. */
function requireReady(options: SwapAgentOptions, model: string): void {
  const r = options.readiness?.get(model);
  if (r && !r.ready) throw new HttpError('E_NOT_READY', `'${model}' is not ready: ${r.reason ?? r.phase}; retry later`);
}

async function proxy(ctx: AgentContext, req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
  const { options } = ctx;
  const body = await readBody(req, res, { maxBytes: options.maxBodyBytes ?? 32 * 1024 * 1024, stallMs: options.bodyStallMs ?? 10_000 }, ctx.budget);
  const model = modelOf(body); // the prompt is never copied into a string here: the body budget bounds what is held
  requireReady(options, model);
  const gone = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) gone.abort();
  });
  const lease = await options.controller.acquire(model, { signal: gone.signal });
  try {
    const upstream = await lease.client.wire.forward({
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
    watchWriteProgress(res, options.responseStallMs ?? 30_000);
    await pipeline(upstream.body, res);
  } finally {
    lease.release();
  }
}
