import type { IncomingMessage, ServerResponse } from 'node:http';
import { timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';

import { toVsnapError, type ErrorCode } from '../errors.js';

/**
 * The agent's own HTTP error codes (beside the SDK's {@link ErrorCode}s): every rejection the
 * agent makes is a JSON body `{ error: { code, message, type } }` with one of these or an SDK code.
 * @internal
 */
export type AgentErrorCode =
  | 'E_UNAUTHORIZED'
  | 'E_NOT_FOUND'
  | 'E_METHOD_NOT_ALLOWED'
  | 'E_BODY_TOO_LARGE'
  | 'E_BAD_REQUEST'
  | 'E_OVERLOADED'
  | 'E_CONTROL_OFF'
  | 'E_HOST_NOT_ALLOWED'
  | 'E_UNSUPPORTED_MEDIA_TYPE'
  | 'E_NOT_READY'
  | 'E_REQUEST_TIMEOUT';

const STATUS: Partial<Record<ErrorCode | AgentErrorCode, number>> = {
  E_UNKNOWN_MODEL: 404,
  E_BUSY: 503,
  E_TIMEOUT: 504,
  E_NOT_RESTORABLE: 409,
  E_INVALID_ARGUMENT: 400,
  E_INVALID_NAME: 400,
  E_ENGINE_UNREACHABLE: 502,
  E_ENGINE_HTTP: 502,
  E_SNAPSHOT_NOT_FOUND: 404,
  E_CLOSED: 503,
  E_ABORTED: 499,
  E_UNAUTHORIZED: 401,
  E_NOT_FOUND: 404,
  E_METHOD_NOT_ALLOWED: 405,
  E_BODY_TOO_LARGE: 413,
  E_BAD_REQUEST: 400,
  E_OVERLOADED: 429,
  E_CONTROL_OFF: 503,
  E_HOST_NOT_ALLOWED: 403,
  E_UNSUPPORTED_MEDIA_TYPE: 415,
  E_NOT_READY: 503,
  E_REQUEST_TIMEOUT: 408,
  E_REGISTRY_TIMEOUT: 504,
};

/** A rejection the agent answers with a status of its own. @internal */
export class HttpError extends Error {
  constructor(
    readonly code: AgentErrorCode,
    message: string,
    /** Close the connection after answering (the request body was not read to its end). */
    readonly close = false,
  ) {
    super(message);
  }
}

/** Sends a JSON answer; with `close`, the connection is closed once it is written (nothing unread stays on it). */
export function send(res: ServerResponse, status: number, body: unknown, close = false): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const text = JSON.stringify(body);
  const headers: Record<string, string | number> = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) };
  if (close) {
    headers.connection = 'close';
    res.on('finish', () => res.socket?.destroySoon());
  }
  res.writeHead(status, headers);
  res.end(text);
}

/**
 * Answers an error as `{ error: { message, type, code } }` with its HTTP status. On the OpenAI
 * routes (`openai`), in OpenAI's shape `{ error: { message, type, param, code } }` with vsnap's
 * code beside it as `vsnap_code`: a model no engine serves is OpenAI's `model_not_found`.
 */
export function sendError(res: ServerResponse, err: unknown, openai = false): void {
  const e = err instanceof HttpError ? err : toVsnapError(err);
  const status = STATUS[e.code] ?? 500;
  if (!openai) return send(res, status, { error: { message: e.message, type: e.code, code: e.code } }, err instanceof HttpError && err.close);
  send(res, status, { error: openAiError(e.code, e.message) }, err instanceof HttpError && err.close);
}

/** OpenAI's error object for a vsnap error code (with the code beside it as `vsnap_code`). */
function openAiError(code: string, message: string): { message: string; type: string; param: string | null; code: string; vsnap_code: string } {
  if (code === 'E_UNKNOWN_MODEL') return { message, type: 'invalid_request_error', param: 'model', code: 'model_not_found', vsnap_code: code };
  return { message, type: code, param: null, code, vsnap_code: code };
}

/** Whether `Authorization` is exactly `Bearer <token>` (a bare token is refused). */
export function bearerMatches(header: string | undefined, token: string): boolean {
  const m = /^Bearer +(\S+)$/i.exec(header ?? '');
  if (!m) return false;
  const presented = Buffer.from(m[1]!);
  const expected = Buffer.from(token);
  return presented.length === expected.length && timingSafeEqual(presented, expected);
}

/**
 * Total request-body bytes the agent holds at once, across all requests (a bound on its memory,
 * whatever the number of concurrent uploads). Only bytes that arrived are held: a declared
 * `Content-Length` reserves nothing, so a client that declares a large body and sends it slowly
 * (or never) holds what it sent, not what it promised. A body whose next bytes do not fit waits
 * (unread, so nothing more is held) for room, first come first served; a body that holds bytes
 * already takes room that is free before a new one (finishing it gives its bytes back).
 * @internal
 */
export class BodyBudget {
  private held = 0;
  /** Bytes held by bodies still being read (the rest belong to requests being answered, given back when they end). */
  private readingHeld = 0;
  private readonly reading = new Set<IncomingMessage>();
  private readonly waiters: Array<{ n: number; wake: () => void; refuse: () => void }> = [];
  constructor(readonly limit: number) {}
  get heldBytes(): number {
    return this.held;
  }
  /** Requests whose body is being read now. */
  get readingBodies(): number {
    return this.reading.size;
  }
  /** Bodies waiting for room. */
  get waitingBodies(): number {
    return this.waiters.length;
  }
  /** Holds `n` bytes for a body being read if they fit; a body that holds none yet (`first`) also lets the bodies waiting go first. */
  take(n: number, first = false): boolean {
    if ((first && this.waiters.length > 0) || this.held + n > this.limit) return false;
    this.held += n;
    this.readingHeld += n;
    return true;
  }
  /** Gives back `n` bytes; `reading`: of a body still being read. */
  give(n: number, reading = false): void {
    this.held -= n;
    if (reading) this.readingHeld -= n;
    this.wakeWaiters();
  }
  /**
   * Calls `wake` once `n` bytes are held for it (first come first served). When every body being
   * read waits and nothing else holds bytes, no room can come: the newest waiter is refused at
   * once (`refuse`) rather than after its deadline. Returns the function that withdraws the wait.
   */
  wait(n: number, wake: () => void, refuse: () => void): () => void {
    const w = { n, wake, refuse };
    this.waiters.push(w);
    this.wakeWaiters();
    if (this.waiters.length > 0 && this.waiters.length === this.reading.size && this.readingHeld === this.held) this.waiters.at(-1)!.refuse();
    return () => {
      const i = this.waiters.indexOf(w);
      if (i >= 0) this.waiters.splice(i, 1);
      this.wakeWaiters();
    };
  }
  private wakeWaiters(): void {
    while (this.waiters.length > 0 && this.held + this.waiters[0]!.n <= this.limit) {
      const w = this.waiters.shift()!;
      this.held += w.n;
      this.readingHeld += w.n;
      w.wake();
    }
  }
  /** A body read began (readBody). */
  started(req: IncomingMessage): void {
    this.reading.add(req);
  }
  /** A body read ended, read or not, holding `held` bytes (readBody): they now belong to its answer. */
  finished(req: IncomingMessage, held: number): void {
    if (this.reading.delete(req)) this.readingHeld -= held;
  }
  /** Closes the connections whose request body is still arriving (nothing was answered on them yet): for a shutdown. */
  dropUnfinished(): void {
    for (const req of this.reading) req.socket.destroy();
  }
}

/** Limits of {@link readBody}. @internal */
export interface BodyLimits {
  /** Largest body, bytes. */
  readonly maxBytes: number;
  /** A body that sends nothing for this long is answered 408 (its bytes given back); a body waiting this long for room in the budget, 429. */
  readonly stallMs: number;
}

/**
 * Reads a request body of at most `limits.maxBytes` bytes, holding its bytes in `budget` as they
 * arrive, until `res` is done. Over the limit (by Content-Length or by what arrives): 413. Bytes
 * that do not fit in the shared budget wait, unread, for room; after `limits.stallMs` of waiting:
 * 429. A body that sends nothing for `limits.stallMs`: 408, so a stalled sender holds its bytes
 * for a bounded time. Each way the connection is closed after the answer, so the unread rest
 * never blocks it. With a declared length, the bytes land in one buffer of that size (held once,
 * not once per chunk and again joined).
 */
export function readBody(req: IncomingMessage, res: ServerResponse, limits: BodyLimits, budget: BodyBudget): Promise<Buffer> {
  const limit = limits.maxBytes;
  const tooLarge = (): HttpError => new HttpError('E_BODY_TOO_LARGE', `the request body is over ${limit} bytes`, true);
  const declared = req.headers['content-length'] === undefined ? undefined : Number(req.headers['content-length']);
  if (declared !== undefined && declared > limit) return Promise.reject(tooLarge());
  let held = 0;
  budget.started(req);
  const done = (): void => budget.finished(req, held);
  res.once('close', () => {
    done();
    budget.give(held);
  });
  return new Promise<Buffer>((resolve, reject) => {
    const into = declared !== undefined && Number.isSafeInteger(declared) && declared > 0 ? Buffer.allocUnsafe(declared) : undefined;
    const chunks: Buffer[] = [];
    let size = 0;
    let timer: NodeJS.Timeout | undefined;
    let withdraw: (() => void) | undefined;
    const arm = (err: () => HttpError): void => {
      clearTimeout(timer);
      timer = setTimeout(() => stop(err()), limits.stallMs);
    };
    const stalled = (): HttpError => new HttpError('E_REQUEST_TIMEOUT', `the request body made no progress for ${limits.stallMs} ms`, true);
    const stop = (err: Error): void => {
      clearTimeout(timer);
      withdraw?.();
      withdraw = undefined;
      req.off('data', onData);
      req.off('end', onEnd);
      req.pause(); // the rest is never read: the answer closes the connection
      done();
      reject(err);
    };
    const keep = (b: Buffer): void => {
      held += b.length;
      if (into) b.copy(into, size - b.length);
      else chunks.push(b);
    };
    const onData = (b: Buffer): void => {
      size += b.length;
      if (size > limit) return stop(tooLarge());
      if (budget.take(b.length, held === 0)) {
        keep(b);
        return arm(stalled);
      }
      // no room: read nothing more until there is, for at most stallMs
      req.pause();
      const overloaded = (): HttpError => new HttpError('E_OVERLOADED', 'the agent holds too many request bodies at once; retry shortly', true);
      arm(overloaded);
      withdraw = budget.wait(
        b.length,
        () => {
          withdraw = undefined;
          keep(b);
          arm(stalled);
          req.resume();
        },
        () => queueMicrotask(() => stop(overloaded())),
      );
    };
    const onEnd = (): void => {
      clearTimeout(timer);
      done();
      resolve(into ? into.subarray(0, size) : Buffer.concat(chunks));
    };
    arm(stalled);
    req.on('data', onData);
    req.on('end', onEnd);
    req.once('error', (err) => {
      clearTimeout(timer);
      withdraw?.();
      done();
      reject(err);
    });
    // a client that goes away mid-body: settle, so nothing waits on it (its bytes are given back on close)
    req.once('close', () => {
      if (!req.complete) {
        clearTimeout(timer);
        withdraw?.();
        done();
        reject(new HttpError('E_BAD_REQUEST', 'the client closed the connection before the body ended', true));
      }
    });
  });
}

/**
 * Destroys a response that has bytes waiting to be sent and sends none of them for `stallMs`: a
 * client that stops reading cannot hold what the response holds (an engine's lease) for longer.
 * A response waiting on its source (an engine still generating) has nothing waiting and is left
 * alone. Returns the function that stops the watch.
 * @internal
 */
export function watchWriteProgress(res: ServerResponse, stallMs: number, now: () => number = Date.now): () => void {
  const socket = res.socket;
  if (!socket) return () => undefined;
  // bytes handed to the kernel: what was written less what still waits in the stream's buffer
  const sent = (): number => socket.bytesWritten - socket.writableLength;
  let mark = sent();
  let since = now();
  const timer = setInterval(() => {
    const s = sent();
    if (s !== mark || (socket.writableLength === 0 && !res.writableNeedDrain)) {
      mark = s;
      since = now();
      return;
    }
    if (now() - since >= stallMs) res.destroy(new HttpError('E_REQUEST_TIMEOUT', `the client read nothing of the response for ${stallMs} ms`));
  }, Math.max(5, Math.floor(stallMs / 4)));
  timer.unref();
  const stop = (): void => clearInterval(timer);
  res.once('close', stop);
  return stop;
}

/**
 * Which `Host` headers the agent answers: IP literals, loopback names (`localhost`,
 * `*.localhost`), the address it listens on, this machine's host name when it listens on every
 * address, and the names of an allow-list (`.example.com` matches its subdomains; `*` matches
 * any). A browser tricked by DNS rebinding sends the attacker's name, which none of these is.
 * @internal
 */
export class HostCheck {
  private readonly names = new Set<string>();
  private readonly suffixes: string[] = [];
  private readonly any: boolean;

  constructor(listenHost: string, allowed: readonly string[] = [], machineName?: string) {
    this.any = allowed.includes('*');
    const wildcard = listenHost === '0.0.0.0' || listenHost === '::' || listenHost === '';
    for (const n of [listenHost, ...(wildcard && machineName ? [machineName] : []), ...allowed]) {
      const name = normalizeHost(n);
      if (name.startsWith('.')) this.suffixes.push(name);
      else if (name) this.names.add(name);
    }
  }

  /** The name of a Host header without its port (what allowedHosts holds), or undefined when malformed. */
  static nameOf(header: string): string | undefined {
    return hostName(header);
  }

  /** Whether a request's Host header is one the agent answers (no header: not a browser, allowed). */
  allows(header: string | undefined): boolean {
    if (header === undefined || this.any) return true;
    const name = hostName(header);
    if (name === undefined) return false;
    if (isIP(name) !== 0 || name === 'localhost' || name.endsWith('.localhost')) return true;
    return this.names.has(name) || this.suffixes.some((s) => name.endsWith(s));
  }
}

function normalizeHost(name: string): string {
  return name.trim().toLowerCase().replace(/\.$/, '').replace(/^\[(.*)\]$/, '$1');
}

/** The host name of a Host header (`name[:port]`, `[v6][:port]`), lowercased; undefined when malformed. */
function hostName(header: string): string | undefined {
  const h = header.trim();
  const m = /^\[([0-9A-Fa-f:.]+)\](?::\d{1,5})?$/.exec(h) ?? /^([^:\s/@[\]]+)(?::\d{1,5})?$/.exec(h);
  return m ? normalizeHost(m[1]!) : undefined;
}

/**
 * A POST that carries a body must say it is JSON (`application/json`, or a `+json` type): a
 * browser sends `text/plain` and form types cross-site without asking, never JSON.
 * @internal
 */
export function requireJsonBody(req: IncomingMessage): void {
  const hasBody = (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0') || req.headers['transfer-encoding'] !== undefined;
  if (!hasBody) return;
  const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
  if (type === 'application/json' || /^application\/[a-z0-9.+-]+\+json$/.test(type)) return;
  throw new HttpError('E_UNSUPPORTED_MEDIA_TYPE', `a request body must be JSON: send Content-Type: application/json (got ${type ? JSON.stringify(type) : 'none'})`, true);
}

/** A path segment, percent-decoded; a malformed escape is a 400, not a crash. */
export function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new HttpError('E_BAD_REQUEST', `malformed percent-encoding in '${segment.slice(0, 64)}'`);
  }
}
