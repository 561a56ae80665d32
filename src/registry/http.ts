import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';

import { Agent, request } from 'undici';

import { abortError, VsnapError } from '../errors.js';
import { OciBody, Watchdog, type RegistryTimeouts } from './body.js';
import { basicHeader, type Challenge, dockerConfigCredentials, parseChallenge, type RegistryCredentials } from './auth.js';
import type { RegistryReference } from './reference.js';

export type { RegistryTimeouts } from './body.js';

/**
 * How to reach a registry.
 * @public
 */
export interface RegistryConnectOptions {
  /** Credentials; default: the Docker config file's entry for the host, else anonymous. */
  readonly credentials?: RegistryCredentials;
  /** Read `~/.docker/config.json` (or `$DOCKER_CONFIG/config.json`) for credentials. Default true. */
  readonly dockerConfig?: boolean;
  /** PEM of the CA(s) to trust for TLS, beside nothing else (a private registry's own CA). */
  readonly ca?: string | Buffer;
  /** Parallel connections for blob transfers. Default 4. */
  readonly connections?: number;
  /** Stall and slowness deadlines of each request. */
  readonly timeouts?: RegistryTimeouts;
}

const MiB = 1024 * 1024;

/**
 * The most bytes read into memory from each kind of body (layers are streamed, never held):
 * - manifest 4 MiB: the distribution spec asks clients and registries to support manifests of
 *   at least 4 MB, and the CNCF distribution registry refuses a larger manifest PUT;
 * - config 64 MiB, and never more than its descriptor's size: a vsnap manifest with every chunk
 *   checksum is a few MiB for the largest models;
 * - token 1 MiB: a JWT is a few KiB (containers/image uses the same 1 MiB bound);
 * - error 64 KiB: only its first 500 characters are shown; the rest is dropped, not read.
 * @internal
 */
export const BODY_LIMITS = { manifest: 4 * MiB, config: 64 * MiB, token: MiB, error: 64 * 1024 } as const;

/**
 * A registry that answers 429 (or 503 with `Retry-After`) is asked again, up to this many times a
 * request, after the wait it names (429 without one: 1 s, 2 s, 4 s, ...), each under the caller's
 * signal (the pull's or push's deadline). @internal
 */
export const BUSY_RETRIES = 4;
/** A `Retry-After` longer than this is not waited for: the request fails at once, saying so. @internal */
export const BUSY_MAX_WAIT_MS = 60_000;

/**
 * How long to wait before asking a busy registry again: `Retry-After` as seconds or an HTTP date;
 * without one, 1 s doubled each retry for a 429 and no retry for a 503; undefined where no retry
 * fits ({@link BUSY_MAX_WAIT_MS}). @internal
 */
export function busyWaitMs(status: number, retryAfter: string | undefined, retry: number, now = Date.now()): number | undefined {
  if (status !== 429 && status !== 503) return undefined;
  let ms: number | undefined;
  if (retryAfter === undefined || retryAfter.trim() === '') ms = status === 429 ? 1000 * 2 ** retry : undefined;
  else if (/^\s*\d+\s*$/.test(retryAfter)) ms = Number(retryAfter) * 1000;
  else {
    const at = Date.parse(retryAfter);
    ms = Number.isNaN(at) ? undefined : Math.max(0, at - now);
  }
  return ms !== undefined && ms <= BUSY_MAX_WAIT_MS ? ms : undefined;
}

/** The default deadlines. @internal */
export const DEFAULT_TIMEOUTS: Required<RegistryTimeouts> = { stallMs: 60_000, graceMs: 60_000, minBytesPerSecond: 64 * 1024 };

/** A response whose body is read through {@link OciBody} (bounded, under the request's deadlines). @internal */
export interface OciResponse {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: OciBody;
  readonly url: URL;
}

type Method = 'GET' | 'HEAD' | 'POST' | 'PATCH' | 'PUT';

/** Counts of what went over the wire (for progress and tests). @internal */
export interface WireCounters {
  requests: number;
  bytesSent: number;
  bytesReceived: number;
}

/**
 * The HTTP side of the OCI distribution API for one repository: the base URL, TLS, and the
 * auth flows registries use (anonymous; basic; bearer tokens from the realm a
 * `WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge names, as `token` or
 * `access_token`). Redirects of GET/HEAD (blob downloads sent to object storage) are followed,
 * and Authorization is never forwarded to another origin. Every request runs under a
 * {@link Watchdog} (stall and rate deadlines), and bodies are read only through {@link OciBody}.
 * @internal
 */
export class OciHttp {
  readonly base: URL;
  readonly counters: WireCounters = { requests: 0, bytesSent: 0, bytesReceived: 0 };
  /** Set once the registry answered a Range request with the whole blob: later blobs are fetched whole. */
  rangeIgnored = false;
  private readonly agent: Agent;
  private readonly credentials: RegistryCredentials | undefined;
  private authorization: string | undefined;
  private readonly scope: string;
  private readonly timeouts: Required<RegistryTimeouts>;

  constructor(
    readonly ref: RegistryReference,
    actions: 'pull' | 'pull,push',
    options: RegistryConnectOptions = {},
  ) {
    this.base = new URL(`${ref.scheme}//${ref.host}`);
    this.credentials = options.credentials ?? (options.dockerConfig === false ? undefined : dockerConfigCredentials(ref.host));
    this.scope = `repository:${ref.repository}:${actions}`;
    this.timeouts = { ...DEFAULT_TIMEOUTS, ...options.timeouts };
    const connections = options.connections ?? 4;
    this.agent = new Agent({
      connections: connections + 2,
      keepAliveTimeout: 10_000,
      // the Watchdog owns the deadlines (coded, with the URL): undici's own are off
      bodyTimeout: 0,
      headersTimeout: 0,
      ...(options.ca !== undefined ? { connect: { ca: options.ca } } : {}),
    });
  }

  /** The URL of an API path under /v2/<repo>/, or an absolute/relative Location the registry gave. */
  url(pathOrLocation: string): URL {
    return new URL(pathOrLocation, this.base);
  }

  repoPath(rest: string): string {
    return `/v2/${this.ref.repository}/${rest}`;
  }

  /**
   * Sends one request, answering auth challenges (once each) and following GET/HEAD redirects.
   * `body` is a Buffer so a retry after a challenge can resend it. Non-`ok` statuses throw
   * E_REGISTRY with the registry's error text.
   */
  async send(method: Method, target: string | URL, init: { headers?: Record<string, string>; body?: Buffer; ok: readonly number[]; signal?: AbortSignal | undefined; what: string }): Promise<OciResponse> {
    let url = typeof target === 'string' ? this.url(target) : target;
    let triedAuth = false;
    let busy = 0;
    for (let hop = 0; hop < 8; hop++) {
      const sameOrigin = url.origin === this.base.origin;
      const headers: Record<string, string> = { 'user-agent': 'vsnap', ...init.headers };
      if (sameOrigin && this.authorization) headers.authorization = this.authorization;
      const res = await this.raw(method, url, headers, init.body, init.signal, init.what);
      if (res.status === 401 && sameOrigin && !triedAuth) {
        const challenge = parseChallenge(first(res.headers['www-authenticate']));
        await res.body.dump();
        triedAuth = true;
        await this.authenticate(challenge, init.signal);
        continue;
      }
      if ((method === 'GET' || method === 'HEAD') && [301, 302, 303, 307, 308].includes(res.status) && res.headers.location) {
        await res.body.dump();
        url = new URL(first(res.headers.location)!, url); // Authorization is only sent to the registry's origin
        continue;
      }
      if (init.ok.includes(res.status)) return res;
      const wait = busy < BUSY_RETRIES ? busyWaitMs(res.status, first(res.headers['retry-after']), busy) : undefined;
      if (wait !== undefined) {
        await res.body.dump();
        busy++;
        hop--; // a retry is no hop
        await sleep(wait, undefined, init.signal ? { signal: init.signal } : {}).catch(() => {
          throw abortError(init.signal!, 'the registry transfer');
        });
        continue;
      }
      throw await httpError(res, init.what, triedAuth, busy);
    }
    throw new VsnapError('E_REGISTRY', `${init.what}: too many redirects or auth round trips at ${this.base.origin}`, { url: url.href });
  }

  private async raw(method: Method, url: URL, headers: Record<string, string>, body: Buffer | undefined, signal: AbortSignal | undefined, what: string): Promise<OciResponse> {
    if (signal?.aborted) throw abortError(signal, 'the registry transfer');
    this.counters.requests++;
    const watch = new Watchdog(this.timeouts, url, what, signal);
    try {
      const res = await request(url, { method, headers, ...(body ? { body: sendable(body, watch) } : {}), dispatcher: this.agent, signal: watch.signal });
      watch.progress(0);
      if (body) this.counters.bytesSent += body.length;
      const length = Number(first(res.headers['content-length']));
      return { status: res.statusCode, headers: res.headers, body: new OciBody(res.body, watch, url, what, Number.isSafeInteger(length) && length >= 0 ? length : undefined), url };
    } catch (err) {
      watch.stop();
      if (signal?.aborted) throw abortError(signal, 'the registry transfer');
      if (watch.error) throw watch.error;
      const e = err as Error & { code?: string };
      if (e.code === 'UND_ERR_SOCKET' || e.code === 'ECONNRESET' || e.code === 'EPIPE') {
        throw new VsnapError('E_REGISTRY', `${what}: the registry at ${url.origin} closed the connection before answering ${method} ${url.origin}${url.pathname} (${e.code}: ${e.message}). Try again; if it keeps happening, the registry (or a proxy in front of it) is failing.`, { url: `${url.origin}${url.pathname}`, errno: e.code }, { cause: err });
      }
      const tls = /CERT|SSL|TLS|self.signed|certificate/i.test(`${e.code ?? ''} ${e.message}`);
      throw new VsnapError(
        'E_REGISTRY',
        `cannot reach the registry at ${url.origin} (${e.code ?? e.name}: ${e.message}). ` +
          (tls ? 'Its TLS certificate is not trusted: pass its CA (--ca <file>, or the `ca` option).' : 'Check the host, the port and http:// vs https://.'),
        { url: url.origin, errno: e.code },
        { cause: err },
      );
    }
  }

  /** Answers a challenge: basic with the credentials, or a bearer token from the realm. */
  private async authenticate(challenge: Challenge | undefined, signal: AbortSignal | undefined): Promise<void> {
    if (challenge?.scheme === 'basic') {
      if (!this.credentials) throw needsCredentials(this.ref.host);
      this.authorization = basicHeader(this.credentials);
      return;
    }
    if (challenge?.scheme !== 'bearer' || !challenge.params.realm) {
      throw new VsnapError('E_REGISTRY_AUTH', `the registry at ${this.base.origin} asked for auth it did not describe (WWW-Authenticate: ${challenge?.scheme ?? 'missing'})`, { host: this.ref.host });
    }
    const realm = tokenRealm(challenge.params.realm, this.base.origin, this.ref.host);
    if (challenge.params.service) realm.searchParams.set('service', challenge.params.service);
    realm.searchParams.set('scope', this.scope);
    const headers: Record<string, string> = { 'user-agent': 'vsnap' };
    if (this.credentials) headers.authorization = basicHeader(this.credentials);
    const what = `a token from ${realm.origin}`;
    const res = await this.raw('GET', realm, headers, undefined, signal, what);
    if (res.status === 401 || res.status === 403) {
      await res.body.dump();
      throw new VsnapError('E_REGISTRY_AUTH', `the token service ${realm.origin} refused ${this.credentials ? `the credentials of '${this.credentials.username}'` : 'anonymous access'} for ${this.scope} (HTTP ${res.status}). ${this.credentials ? 'Check the user name and password (docker login, or the credentials option).' : 'Log in (docker login) or pass credentials.'}`, { host: this.ref.host, status: res.status });
    }
    if (res.status !== 200) throw new VsnapError('E_REGISTRY', `the token service ${realm.origin} answered HTTP ${res.status}: ${(await res.body.prefix(BODY_LIMITS.error)).slice(0, 200)}`, { status: res.status, url: `${realm.origin}${realm.pathname}` });
    const text = await res.body.text(
      BODY_LIMITS.token,
      (n) => new VsnapError('E_REGISTRY', `the token service ${realm.origin} answered ${n} bytes or more; a token answer is at most ${BODY_LIMITS.token} bytes. Refusing it.`, { host: this.ref.host, url: `${realm.origin}${realm.pathname}`, limit: BODY_LIMITS.token }),
    );
    let token: unknown;
    try {
      const json = JSON.parse(text) as { token?: unknown; access_token?: unknown };
      token = json.token ?? json.access_token;
    } catch {
      token = undefined;
    }
    if (typeof token !== 'string' || token.length === 0) throw new VsnapError('E_REGISTRY', `the token service ${realm.origin} answered without a token`, { host: this.ref.host });
    this.authorization = `Bearer ${token}`;
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}

/** A request body that reports its progress to the watchdog as the socket takes it (a small one goes whole). */
function sendable(body: Buffer, watch: Watchdog): Buffer | Readable {
  if (body.length <= MiB) return body;
  return Readable.from(
    (async function* pieces() {
      for (let off = 0; off < body.length; off += MiB) {
        const piece = body.subarray(off, off + MiB);
        yield piece;
        watch.progress(piece.length);
      }
    })(),
    { objectMode: false, highWaterMark: 1 },
  );
}

/** The realm of a bearer challenge as an absolute http(s) URL, else a coded refusal naming it. */
function tokenRealm(realm: string, origin: string, host: string): URL {
  let url: URL | undefined;
  try {
    url = new URL(realm);
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== 'https:' && url.protocol !== 'http:')) {
    throw new VsnapError(
      'E_REGISTRY',
      `the registry at ${origin} asks for a bearer token from realm ${JSON.stringify(realm.slice(0, 200))}, which is not an http(s) URL, so no token can be fetched. The registry's token auth is misconfigured (its realm must be the token service's absolute URL): tell its operator.`,
      { host, realm: realm.slice(0, 200) },
    );
  }
  return url;
}

function first(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

function needsCredentials(host: string): VsnapError {
  return new VsnapError('E_REGISTRY_AUTH', `the registry ${host} needs credentials: run \`docker login ${host}\` (vsnap reads ~/.docker/config.json or $DOCKER_CONFIG), or pass them`, { host });
}

/** E_REGISTRY_AUTH for 401/403, E_SNAPSHOT_NOT_FOUND for an unknown manifest, else E_REGISTRY, with the registry's error text. */
async function httpError(res: OciResponse, what: string, triedAuth: boolean, retries = 0): Promise<VsnapError> {
  // at most BODY_LIMITS.error bytes are read: a registry may answer an error with an endless body
  const full = await res.body.prefix(BODY_LIMITS.error);
  const text = full.slice(0, 500);
  let detail = text;
  try {
    const errors = (JSON.parse(full) as { errors?: Array<{ code?: string; message?: string }> }).errors;
    if (errors?.length) detail = errors.map((e) => `${e.code ?? ''}: ${e.message ?? ''}`).join('; ').slice(0, 500);
  } catch {
    /* not the distribution error shape */
  }
  const where = `${res.url.origin}${res.url.pathname}`;
  if (res.status === 401 || res.status === 403) {
    return new VsnapError('E_REGISTRY_AUTH', `${what}: the registry refused ${triedAuth ? 'the credentials' : 'the request'} (HTTP ${res.status} at ${where}: ${detail}). Check the user name and password (docker login) and the repository permissions.`, { status: res.status, url: where });
  }
  if (res.status === 404 && /MANIFEST_UNKNOWN|NAME_UNKNOWN/.test(text)) {
    return new VsnapError('E_SNAPSHOT_NOT_FOUND', `${what}: not in the registry (${where}: ${detail}). Check the repository and tag.`, { status: 404, url: where });
  }
  if (res.status === 429 || res.status === 503) {
    const after = first(res.headers['retry-after']);
    const asked = after !== undefined ? ` (Retry-After: ${after.slice(0, 40)})` : '';
    const done = retries > 0 ? `, asked ${retries + 1} times` : after !== undefined ? `, not retried (vsnap waits at most ${BUSY_MAX_WAIT_MS / 1000} s)` : '';
    return new VsnapError('E_REGISTRY', `${what}: the registry at ${res.url.origin} is busy: HTTP ${res.status}${asked} from ${where}${done}. Try again later.`, { status: res.status, url: where, retries, ...(after !== undefined ? { retryAfter: after.slice(0, 40) } : {}) });
  }
    return new VsnapError('E_REGISTRY', `${what}: HTTP ${res.status} from ${where}${detail ? `: ${detail}` : ''}`, { status: res.status, url: where });
}
