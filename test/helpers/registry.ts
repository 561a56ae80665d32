import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createPrivateKey, createSign, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { Agent, request } from 'undici';

import { freePort } from './net.js';

/** The CNCF distribution registry as Debian packages it (`docker-registry`). */
export const REGISTRY_BIN = '/usr/bin/docker-registry';

/** Skips only when asked (VSNAP_SKIP_REGISTRY=1); otherwise a missing binary fails loudly. */
export function registryAvailable(): boolean {
  if (existsSync(REGISTRY_BIN)) return true;
  if (process.env.VSNAP_SKIP_REGISTRY === '1') return false;
  throw new Error(`${REGISTRY_BIN} is missing: install Debian's docker-registry package (apt-get install docker-registry; .ci/run does), or set VSNAP_SKIP_REGISTRY=1 to skip these tests`);
}

export interface TestRegistry {
  /** host:port */
  readonly host: string;
  /** `http://host` for a plain registry, else `host` (https). */
  readonly prefix: string;
  /** The registry's storage root (tests corrupt blobs there). */
  readonly storage: string;
  /** The CA that signed its TLS certificate. */
  readonly ca?: string;
  /** Request lines seen (method and path), from the registry's own log. */
  requests(): Array<{ method: string; path: string; status: number }>;
  /**
   * Requests logged between two marks: sends a marker request and waits until the registry has
   * logged it, so lines of earlier requests are never counted later. Returns the requests since
   * the previous mark.
   */
  mark(): Promise<Array<{ method: string; path: string; status: number }>>;
  /** Requests the token server answered (bearer mode). */
  readonly tokenRequests: URL[];
  close(): Promise<void>;
}

/** A CA and a server certificate for 127.0.0.1, made with openssl. */
function makeTls(dir: string): { ca: string; cert: string; key: string } {
  const run = (...args: string[]): void => void execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  run('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=vsnap test CA');
  run('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  writeFileSync(join(dir, 'san.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  run('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.crt', '-days', '2', '-extfile', 'san.ext');
  return { ca: readFileSync(join(dir, 'ca.crt'), 'utf8'), cert: join(dir, 'server.crt'), key: join(dir, 'server.key') };
}

/** A JWT token server as the registry's `auth: token` expects: ES256, the signing cert in `x5c`. */
async function startTokenServer(dir: string, user: { name: string; password: string }, seen: URL[], field: 'token' | 'access_token'): Promise<{ server: Server; url: string; bundle: string }> {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', 'token.key', '-out', 'token.crt', '-days', '2', '-subj', '/CN=vsnap test token issuer'], { cwd: dir, stdio: 'pipe' });
  const key = createPrivateKey(readFileSync(join(dir, 'token.key')));
  const der = execFileSync('openssl', ['x509', '-in', 'token.crt', '-outform', 'DER'], { cwd: dir });
  const b64u = (b: Buffer | string): string => Buffer.from(b).toString('base64url');
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    seen.push(url);
    const auth = req.headers.authorization ?? '';
    const given = auth.startsWith('Basic ') ? Buffer.from(auth.slice(6), 'base64').toString() : '';
    if (given !== `${user.name}:${user.password}`) {
      res.writeHead(401, { 'content-type': 'application/json' }).end('{"details":"bad credentials"}');
      return;
    }
    const access = (url.searchParams.getAll('scope')).map((s) => {
      const [type, name, actions] = s.split(':');
      return { type, name, actions: (actions ?? '').split(',') };
    });
    const now = Math.floor(Date.now() / 1000);
    const header = { alg: 'ES256', typ: 'JWT', x5c: [der.toString('base64')] };
    const claims = { iss: 'vsnap-test-issuer', sub: user.name, aud: url.searchParams.get('service'), exp: now + 300, nbf: now - 10, iat: now, jti: randomBytes(8).toString('hex'), access };
    const input = `${b64u(JSON.stringify(header))}.${b64u(JSON.stringify(claims))}`;
    const sig = createSign('SHA256').update(input).sign({ key, dsaEncoding: 'ieee-p1363' });
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ [field]: `${input}.${b64u(sig)}`, expires_in: 300 }));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/token`, bundle: join(dir, 'token.crt') };
}

/**
 * Starts the distribution registry on loopback: plain or TLS, anonymous, htpasswd (bcrypt
 * through apache2-utils' htpasswd) or bearer tokens from a test token server.
 */
export async function startRegistry(dir: string, options: { tls?: boolean; auth?: 'none' | 'htpasswd' | 'token'; user?: { name: string; password: string }; tokenField?: 'token' | 'access_token' } = {}): Promise<TestRegistry> {
  mkdirSync(join(dir, 'storage'), { recursive: true });
  const port = await freePort();
  const tls = options.tls ? makeTls(dir) : undefined;
  const user = options.user ?? { name: 'alice', password: 'wonderland' };
  const tokenRequests: URL[] = [];
  let token: Awaited<ReturnType<typeof startTokenServer>> | undefined;
  let auth = '';
  if (options.auth === 'htpasswd') {
    const line = execFileSync('htpasswd', ['-nbB', user.name, user.password], { encoding: 'utf8' }).trim();
    writeFileSync(join(dir, 'htpasswd'), `${line}\n`);
    auth = `auth:\n  htpasswd:\n    realm: vsnap-test\n    path: ${join(dir, 'htpasswd')}\n`;
  } else if (options.auth === 'token') {
    token = await startTokenServer(dir, user, tokenRequests, options.tokenField ?? 'token');
    auth = `auth:\n  token:\n    realm: ${token.url}\n    service: vsnap-test\n    issuer: vsnap-test-issuer\n    rootcertbundle: ${token.bundle}\n`;
  }
  const config = [
    'version: 0.1',
    'log:\n  level: info\n  formatter: json\n  accesslog:\n    disabled: false',
    `storage:\n  filesystem:\n    rootdirectory: ${join(dir, 'storage')}\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false`,
    `http:\n  addr: 127.0.0.1:${port}\n  secret: vsnap-test-secret${tls ? `\n  tls:\n    certificate: ${tls.cert}\n    key: ${tls.key}` : ''}`,
    auth,
  ].join('\n');
  writeFileSync(join(dir, 'config.yml'), config);
  const child: ChildProcess = spawn(REGISTRY_BIN, ['serve', join(dir, 'config.yml')], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout!.on('data', (d: Buffer) => (log += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (log += d.toString()));
  const base = `${tls ? 'https' : 'http'}://127.0.0.1:${port}`;
  const agent = new Agent(tls ? { connect: { ca: tls.ca } } : {});
  const deadline = Date.now() + 15_000;
  for (;;) {
    try {
      const res = await request(`${base}/v2/`, { dispatcher: agent });
      await res.body.dump();
      break;
    } catch (err) {
      if (child.exitCode !== null || Date.now() > deadline) {
        await agent.close();
        child.kill('SIGKILL');
        token?.server.close();
        throw new Error(`the registry did not start: ${(err as Error).message}\n${log.slice(-2000)}`);
      }
      await sleep(50);
    }
  }
  const host = `127.0.0.1:${port}`;
  let lastMark = 0;
  // the access log: combined log format lines, "METHOD /path HTTP/1.1" status
  const requests = (): Array<{ method: string; path: string; status: number }> =>
    [...log.matchAll(/"(GET|HEAD|POST|PATCH|PUT|DELETE) ([^ "]+) HTTP\/[0-9.]+" (\d+)/g)].map((m) => ({ method: m[1]!, path: m[2]!, status: Number(m[3]) }));
  return {
    host,
    prefix: tls ? host : `http://${host}`,
    storage: join(dir, 'storage'),
    ...(tls ? { ca: tls.ca } : {}),
    tokenRequests,
    requests,
    async mark() {
      const id = randomBytes(6).toString('hex');
      const res = await request(`${base}/v2/vsnap-mark-${id}/tags/list`, { dispatcher: agent });
      await res.body.dump();
      while (!log.includes(`vsnap-mark-${id}`)) await sleep(10);
      const all = requests();
      const at = all.findIndex((r) => r.path.includes(`vsnap-mark-${id}`));
      const since = all.slice(lastMark, at);
      lastMark = at + 1;
      return since;
    },
    async close() {
      await agent.close();
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await Promise.race([exited, sleep(5000)]);
      if (child.exitCode === null) child.kill('SIGKILL');
      if (token) await new Promise((r) => token.server.close(r));
    },
  };
}
