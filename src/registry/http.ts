import { Agent, type Dispatcher, request } from 'undici';

import { abortError, VsnapError } from '../errors.js';
import { basicHeader, type Challenge, dockerConfigCredentials, parseChallenge, type RegistryCredentials } from './auth.js';
import type { RegistryReference } from './reference.js';

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
}

/** A response with its body read (small ones) or streamed (blobs). @internal */
export interface OciResponse {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: Dispatcher.ResponseData['body'];
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
 * and Authorization is never forwarded to another origin.
 * @internal
 */
export class OciHttp {
  readonly base: URL;
  readonly counters: WireCounters = { requests: 0, bytesSent: 0, bytesReceived: 0 };
  private readonly agent: Agent;
  private readonly credentials: RegistryCredentials | undefined;
  private authorization: string | undefined;
  private readonly scope: string;

  constructor(
    readonly ref: RegistryReference,
    actions: 'pull' | 'pull,push',
    options: RegistryConnectOptions = {},
  ) {
    this.base = new URL(`${ref.scheme}//${ref.host}`);
    this.credentials = options.credentials ?? (options.dockerConfig === false ? undefined : dockerConfigCredentials(ref.host));
    this.scope = `repository:${ref.repository}:${actions}`;
    const connections = options.connections ?? 4;
    this.agent = new Agent({
      connections: connections + 2,
      keepAliveTimeout: 10_000,
      bodyTimeout: 120_000,
      headersTimeout: 60_000,
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
    for (let hop = 0; hop < 8; hop++) {
      const sameOrigin = url.origin === this.base.origin;
      const headers: Record<string, string> = { 'user-agent': 'vsnap', ...init.headers };
      if (sameOrigin && this.authorization) headers.authorization = this.authorization;
      const res = await this.raw(method, url, headers, init.body, init.signal);
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
      throw await httpError(res, init.what, triedAuth);
    }
    throw new VsnapError('E_REGISTRY', `${init.what}: too many redirects or auth round trips at ${this.base.origin}`, { url: url.href });
  }

  private async raw(method: Method, url: URL, headers: Record<string, string>, body: Buffer | undefined, signal: AbortSignal | undefined): Promise<OciResponse> {
    if (signal?.aborted) throw abortError(signal, 'the registry transfer');
    this.counters.requests++;
    try {
      const res = await request(url, { method, headers, ...(body ? { body } : {}), dispatcher: this.agent, ...(signal ? { signal } : {}) });
      if (body) this.counters.bytesSent += body.length;
      return { status: res.statusCode, headers: res.headers, body: res.body, url };
    } catch (err) {
      if (signal?.aborted) throw abortError(signal, 'the registry transfer');
      const e = err as Error & { code?: string };
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
    const realm = new URL(challenge.params.realm);
    if (challenge.params.service) realm.searchParams.set('service', challenge.params.service);
    realm.searchParams.set('scope', this.scope);
    const headers: Record<string, string> = { 'user-agent': 'vsnap' };
    if (this.credentials) headers.authorization = basicHeader(this.credentials);
    const res = await this.raw('GET', realm, headers, undefined, signal);
    const text = await res.body.text();
    if (res.status === 401 || res.status === 403) {
      throw new VsnapError('E_REGISTRY_AUTH', `the token service ${realm.origin} refused ${this.credentials ? `the credentials of '${this.credentials.username}'` : 'anonymous access'} for ${this.scope} (HTTP ${res.status}). ${this.credentials ? 'Check the user name and password (docker login, or the credentials option).' : 'Log in (docker login) or pass credentials.'}`, { host: this.ref.host, status: res.status });
    }
    if (res.status !== 200) throw new VsnapError('E_REGISTRY', `the token service ${realm.origin} answered HTTP ${res.status}: ${text.slice(0, 200)}`, { status: res.status });
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

function first(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

function needsCredentials(host: string): VsnapError {
  return new VsnapError('E_REGISTRY_AUTH', `the registry ${host} needs credentials: run \`docker login ${host}\` (vsnap reads ~/.docker/config.json or $DOCKER_CONFIG), or pass them`, { host });
}

/** E_REGISTRY_AUTH for 401/403, E_SNAPSHOT_NOT_FOUND for an unknown manifest, else E_REGISTRY, with the registry's error text. */
async function httpError(res: OciResponse, what: string, triedAuth: boolean): Promise<VsnapError> {
  let text = '';
  try {
    text = (await res.body.text()).slice(0, 500);
  } catch {
    /* the body is only for the message */
  }
  let detail = text;
  try {
    const errors = (JSON.parse(text) as { errors?: Array<{ code?: string; message?: string }> }).errors;
    if (errors?.length) detail = errors.map((e) => `${e.code ?? ''}: ${e.message ?? ''}`).join('; ');
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
  return new VsnapError('E_REGISTRY', `${what}: HTTP ${res.status} from ${where}${detail ? `: ${detail}` : ''}`, { status: res.status, url: where });
}
