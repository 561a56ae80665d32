import type { IncomingMessage, ServerResponse } from 'node:http';
import { timingSafeEqual } from 'node:crypto';

import { toVsnapError, type ErrorCode } from '../errors.js';

/**
 * The agent's own HTTP error codes (beside the SDK's {@link ErrorCode}s): every rejection the
 * agent makes is a JSON body `{ error: { code, message, type } }` with one of these or an SDK code.
 * @internal
 */
export type AgentErrorCode = 'E_UNAUTHORIZED' | 'E_NOT_FOUND' | 'E_METHOD_NOT_ALLOWED' | 'E_BODY_TOO_LARGE' | 'E_BAD_REQUEST' | 'E_OVERLOADED' | 'E_CONTROL_OFF';

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

/** Answers an error as `{ error: { message, type, code } }` with its HTTP status. */
export function sendError(res: ServerResponse, err: unknown): void {
  if (err instanceof HttpError) {
    send(res, STATUS[err.code]!, { error: { message: err.message, type: err.code, code: err.code } }, err.close);
    return;
  }
  const e = toVsnapError(err);
  send(res, STATUS[e.code] ?? 500, { error: { message: e.message, type: e.code, code: e.code } });
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
 * whatever the number of concurrent uploads).
 * @internal
 */
export class BodyBudget {
  private held = 0;
  constructor(readonly limit: number) {}
  get heldBytes(): number {
    return this.held;
  }
  take(n: number): boolean {
    if (this.held + n > this.limit) return false;
    this.held += n;
    return true;
  }
  give(n: number): void {
    this.held -= n;
  }
}

/**
 * Reads a request body of at most `limit` bytes, holding its bytes in `budget` until `res` is
 * done. Over the limit (by Content-Length or by what arrives): 413; over the shared budget: 429.
 * Either way the connection is closed after the answer, so the unread rest never blocks it.
 */
export function readBody(req: IncomingMessage, res: ServerResponse, limit: number, budget: BodyBudget): Promise<Buffer> {
  const tooLarge = (): HttpError => new HttpError('E_BODY_TOO_LARGE', `the request body is over ${limit} bytes`, true);
  const declared = req.headers['content-length'] === undefined ? undefined : Number(req.headers['content-length']);
  if (declared !== undefined && declared > limit) return Promise.reject(tooLarge());
  let held = 0;
  res.once('close', () => budget.give(held));
  const reserve = (n: number): HttpError | undefined => {
    if (!budget.take(n)) return new HttpError('E_OVERLOADED', 'the agent holds too many request bodies at once; retry shortly', true);
    held += n;
    return undefined;
  };
  if (declared) {
    const err = reserve(declared);
    if (err) return Promise.reject(err);
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const stop = (err: Error): void => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.pause(); // the rest is never read: the answer closes the connection
      reject(err);
    };
    const onData = (b: Buffer): void => {
      size += b.length;
      if (size > limit) return stop(tooLarge());
      if (size > held) {
        const err = reserve(size - held);
        if (err) return stop(err);
      }
      chunks.push(b);
    };
    const onEnd = (): void => resolve(Buffer.concat(chunks));
    req.on('data', onData);
    req.on('end', onEnd);
    req.once('error', reject);
    // a client that goes away mid-body: settle, so nothing waits on it (its bytes are given back on close)
    req.once('close', () => {
      if (!req.complete) reject(new HttpError('E_BAD_REQUEST', 'the client closed the connection before the body ended', true));
    });
  });
}

/** A path segment, percent-decoded; a malformed escape is a 400, not a crash. */
export function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new HttpError('E_BAD_REQUEST', `malformed percent-encoding in '${segment.slice(0, 64)}'`);
  }
}
