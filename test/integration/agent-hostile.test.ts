import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import fc from 'fast-check';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapAgent } from '../../src/serve/agent.js';
import { SwapController } from '../../src/swap/controller.js';
import { startEngine, type TestEngine } from '../helpers/engine.js';
import { raw, until } from '../helpers/net.js';

const GB = 1e9;
const MODEL = 'model-1';
let engine: TestEngine;
let client: EngineClient;
let controller: SwapController;
let store: RegionStore;
let storeDir: string;
const agents: SwapAgent[] = [];

beforeAll(async () => {
  engine = await startEngine({ seed: 1, model: MODEL });
  client = new EngineClient({ baseUrl: engine.url, token: engine.token });
  storeDir = mkdtempSync(join(tmpdir(), 'vsnap-agent-hostile-')); // for the whole file (tempDir() is per test)
  store = await RegionStore.open(storeDir);
  controller = await SwapController.create({ store, engines: [{ name: MODEL, client, memoryBytes: 10 * GB }], budgets: { 0: 20 * GB } });
});
afterAll(async () => {
  for (const a of agents) await a.close();
  await controller?.close();
  await client?.close();
  await engine?.stop();
  if (storeDir) rmSync(storeDir, { recursive: true, force: true });
});

async function agent(options: Partial<Parameters<typeof SwapAgent.listen>[0]> = {}): Promise<SwapAgent> {
  const a = await SwapAgent.listen({ controller, store, ...options });
  agents.push(a);
  return a;
}

describe('the agent against hostile or broken peers', () => {
  it('an oversize body (declared or chunked) gets 413 E_BODY_TOO_LARGE and the keep-alive connection is closed, not left stuck', async () => {
    const a = await agent({ maxBodyBytes: 1024 });
    const declared = raw(a.url);
    declared.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n${'x'.repeat(100)}`);
    await declared.closed;
    expect(declared.received()).toMatch(/^HTTP\/1\.1 413 /);
    expect(declared.received()).toMatch(/connection: close/i);
    expect(declared.received()).toContain('E_BODY_TOO_LARGE');

    const chunked = raw(a.url);
    chunked.socket.write('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n');
    for (let i = 0; i < 4; i++) chunked.socket.write(`200\r\n${'y'.repeat(0x200)}\r\n`); // 2 KiB, never terminated
    await chunked.closed;
    expect(chunked.received()).toMatch(/^HTTP\/1\.1 413 /);
    expect(chunked.received()).toContain('E_BODY_TOO_LARGE');
  });

  it('total in-flight body bytes are bounded across requests, counted as they arrive: bytes beyond the budget wait unread for room; the budget comes back', async () => {
    const a = await agent({ maxBodyBytes: 3000, maxInFlightBodyBytes: 4000, bodyStallMs: 600_000 });
    const first = raw(a.url);
    const head = '{"model":"nope","pad":"';
    first.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 3000\r\n\r\n${head}${'p'.repeat(2500 - head.length)}`);
    await until(() => a.bodyReads().heldBytes === 2500); // the agent holds what arrived, not the 3000 declared
    const second = raw(a.url);
    second.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n${head}${'q'.repeat(1600 - head.length)}`);
    await until(() => a.bodyReads().waiting === 1); // its bytes do not fit: not held, not read
    expect(a.bodyReads().heldBytes).toBe(2500);
    // the first completes (unknown model: 404) and gives its bytes back; the second then fits
    first.socket.end(`${'p'.repeat(500 - 2)}"}`);
    await until(() => first.received().length > 0);
    expect(first.received()).toMatch(/^HTTP\/1\.1 404 /);
    await until(() => a.bodyReads().heldBytes === 1600 && a.bodyReads().waiting === 0);
    second.socket.end(`${'q'.repeat(400 - 2)}"}`);
    await until(() => second.received().length > 0);
    expect(second.received()).toMatch(/^HTTP\/1\.1 404 /);
    await until(() => a.bodyReads().heldBytes === 0);
    const third = await request(`${a.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'nope', pad: 'z'.repeat(2500) }) });
    expect(third.statusCode).toBe(404);
    expect(((await third.body.json()) as { error: { vsnap_code: string } }).error.vsnap_code).toBe('E_UNKNOWN_MODEL');
  });

  it('8 connections that declare 32 MiB bodies and send 1 byte starve nobody: every completion of a good client is served', async () => {
    const a = await agent({ bodyStallMs: 600_000 }); // the defaults (32 MiB per body, 256 MiB in flight), attackers never cut here
    const attackers = Array.from({ length: 8 }, () => raw(a.url));
    for (const t of attackers) {
      t.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${32 * 1024 * 1024}\r\n\r\n{`);
    }
    try {
      await until(() => a.bodyReads().requests === 8); // every attacker's body is being read (and never finishes)
      const GOOD = 20;
      for (let i = 0; i < GOOD; i++) {
        const r = await request(`${a.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'The capital of France is', max_tokens: 2 }) });
        expect(r.statusCode, await r.body.text()).toBe(200);
      }
      expect(a.bodyReads()).toEqual({ requests: 8, heldBytes: 8, waiting: 0 });
      expect(attackers.every((t) => t.received() === '')).toBe(true);
    } finally {
      for (const t of attackers) t.socket.destroy();
    }
    await until(() => a.bodyReads().requests === 0 && a.bodyReads().heldBytes === 0);
  });

  it('close() does not wait for connections still sending a body', async () => {
    const a = await SwapAgent.listen({ controller, store });
    const stalled = raw(a.url);
    stalled.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{`);
    await until(() => a.bodyReads().requests === 1);
    await a.close();
    await stalled.closed;
  });

  it('a body that never ends is cut at the request timeout (408, connection closed) and its bytes are given back', async () => {
    const a = await agent({ requestTimeoutMs: 400, headersTimeoutMs: 200 });
    const slow = raw(a.url);
    slow.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model":`);
    await slow.closed;
    expect(slow.received()).toMatch(/^HTTP\/1\.1 408 /);
    await until(() => a.bodyReads().requests === 0 && a.bodyReads().heldBytes === 0);
    const headers = raw(a.url); // headers that never end
    headers.socket.write('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n');
    await headers.closed;
    expect(headers.received()).toMatch(/^HTTP\/1\.1 408 /);
  });

  it('DNS rebinding: a Host the agent is not reached by gets 403 E_HOST_NOT_ALLOWED on every route; loopback names, IP literals and allowedHosts pass', async () => {
    const a = await agent({});
    const port = new URL(a.url).port;
    const ask = async (host: string, path = '/v1/completions') => {
      const t = raw(a.url);
      const body = JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: 1 });
      t.socket.write(`POST ${path} HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
      await t.closed;
      return t.received();
    };
    for (const host of [`evil.example:${port}`, 'evil.example', `127.0.0.1.evil.example:${port}`, 'localhost.evil.example', 'a b', `user@127.0.0.1:${port}`]) {
      const answer = await ask(host);
      expect(answer, host).toMatch(/^HTTP\/1\.1 403 /);
      expect(answer).toContain('E_HOST_NOT_ALLOWED');
      expect(answer).not.toMatch(/x-vsnap-engine/i);
    }
    for (const path of ['/api/status', '/healthz', '/', '/v1/models']) {
      const r = await request(`${a.url}${path}`, { headers: { host: 'rebound.example' } });
      expect(r.statusCode, path).toBe(403);
      await r.body.dump();
    }
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, 'localhost', `[::1]:${port}`, `model.localhost:${port}`, `LOCALHOST.:${port}`, `10.1.2.3:${port}`]) {
      expect(await ask(host), host).toMatch(/^HTTP\/1\.1 200 /);
    }
    const named = await agent({ allowedHosts: ['gpu-1.example.com', '.corp.example'] });
    const status = async (host: string) => {
      const r = await request(`${named.url}/v1/models`, { headers: { host } });
      await r.body.dump();
      return r.statusCode;
    };
    expect(await status('gpu-1.example.com:8080')).toBe(200);
    expect(await status('a.b.corp.example')).toBe(200);
    expect(await status('corp.example.evil')).toBe(403);
    expect(await status('gpu-2.example.com')).toBe(403);
    const open = await agent({ allowedHosts: ['*'] });
    expect((await request(`${open.url}/v1/models`, { headers: { host: 'anything.example' } })).statusCode).toBe(200);
  });

  it('a POST body that is not JSON (text/plain, a form: what a cross-site page sends unasked) gets 415 and is never run', async () => {
    const a = await agent({});
    const body = JSON.stringify({ model: MODEL, prompt: 'The capital of France is', max_tokens: 2 });
    for (const type of ['text/plain', 'text/plain;charset=UTF-8', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', undefined]) {
      for (const path of ['/v1/completions', '/v1/chat/completions']) {
        const r = await request(`${a.url}${path}`, { method: 'POST', headers: type ? { 'content-type': type } : {}, body });
        const text = await r.body.text();
        expect(r.statusCode, `${type}: ${text}`).toBe(415);
        expect(JSON.parse(text).error.code).toBe('E_UNSUPPORTED_MEDIA_TYPE');
        expect(r.headers['x-vsnap-engine']).toBeUndefined();
      }
    }
    for (const type of ['application/json', 'application/json; charset=utf-8', 'Application/JSON']) {
      const r = await request(`${a.url}/v1/completions`, { method: 'POST', headers: { 'content-type': type }, body });
      expect(r.statusCode, type).toBe(200);
      await r.body.dump();
    }
  });

  it('a bare token without "Bearer " is refused, on control routes and on /v1 with an API key', async () => {
    const a = await agent({ controlToken: 'ctl', apiKey: 'key' });
    const status = async (path: string, authorization?: string) => (await request(`${a.url}${path}`, { headers: authorization ? { authorization } : {} })).statusCode;
    expect(await status(`/engines/${MODEL}/snapshot_status`, 'ctl')).toBe(401);
    expect(await status(`/engines/${MODEL}/snapshot_status`, 'Bearer ctl')).toBe(200);
    expect(await status('/v1/models', 'key')).toBe(401);
    expect(await status('/v1/models', 'Bearer key')).toBe(200);
  });

  it('a malformed percent-encoding in a route is a 400 E_BAD_REQUEST, not a 500', async () => {
    const a = await agent({ controlToken: 'ctl' });
    const r = await request(`${a.url}/engines/%E0%A4%A/snapshot_status`, { headers: { authorization: 'Bearer ctl' } });
    expect(r.statusCode).toBe(400);
    expect(((await r.body.json()) as { error: { code: string } }).error.code).toBe('E_BAD_REQUEST');
  });

  it('/healthz and /metrics: private by default with a control token, public without one or when told', async () => {
    const priv = await agent({ controlToken: 'ctl' });
    const health = (await (await request(`${priv.url}/healthz`)).body.json()) as Record<string, unknown>;
    expect(health).toEqual({ ok: true, status: 'ok' });
    expect(JSON.stringify(health)).not.toContain(MODEL);
    const m = await request(`${priv.url}/metrics`);
    expect(m.statusCode).toBe(401);
    await m.body.dump();
    expect(JSON.stringify(await (await request(`${priv.url}/healthz`, { headers: { authorization: 'Bearer ctl' } })).body.json())).toContain(MODEL);
    expect(await (await request(`${priv.url}/metrics`, { headers: { authorization: 'Bearer ctl' } })).body.text()).toContain('vsnap_awake_engines');

    for (const open of [await agent({}), await agent({ controlToken: 'ctl', publicStatus: true })]) {
      expect(JSON.stringify(await (await request(`${open.url}/healthz`)).body.json())).toContain(MODEL);
      const r = await request(`${open.url}/metrics`);
      expect(r.statusCode).toBe(200);
      await r.body.dump();
    }
  });

  it(`property: ${Number(process.env.VSNAP_FUZZ_RUNS ?? 10_000)} random requests on every route: no crash, every rejection a coded 4xx`, async () => {
    const a = await agent({ controlToken: 'ctl', apiKey: 'key', maxBodyBytes: 64 * 1024 });
    const segment = fc.oneof(
      fc.constantFrom(MODEL, 'nope', 'a%2Fb', '%E0%A4%A', '%', '%zz', '..', '%2e%2e', 'model%2D1', ''),
      fc.stringMatching(/^[A-Za-z0-9._~%-]{0,24}$/),
    );
    const path = fc.oneof(
      fc.constantFrom('/', '/index.html', '/healthz', '/metrics', '/api/status', '/v1/models', '/v1/completions', '/v1/chat/completions', '/v1/', '/v1/embeddings', '/engines/'),
      fc.tuple(segment, fc.constantFrom('snapshot_status', 'snapshot_status', 'snapshot', 'suspend', 'restore', 'other')).map(([n, act]) => `/engines/${n}/${act}`),
      fc.tuple(fc.constantFrom('/v1/', '/engines/', '/api/', '/'), segment, fc.constantFrom('', '?force=1', '?x=%zz', '#f')).map(([p, s, q]) => `${p}${s}${q}`),
    );
    const auth = fc.constantFrom(undefined, 'Bearer ctl', 'Bearer key', 'ctl', 'key', 'Bearer', 'Bearer  ', 'bearer ctl', 'Basic Y3Rs', 'Bearer wrong');
    const body = fc.oneof(
      fc.constant(undefined),
      fc.json({ maxDepth: 3 }),
      fc.string({ maxLength: 64 }),
      fc.record({ model: fc.oneof(fc.constantFrom(MODEL, 'nope', ''), fc.integer(), fc.constant(null)), prompt: fc.oneof(fc.string({ maxLength: 16 }), fc.integer()), max_tokens: fc.integer({ min: -2, max: 4 }) }).map((o) => JSON.stringify(o)),
    );
    const method = fc.constantFrom('GET', 'GET', 'POST', 'POST', 'PUT', 'DELETE', 'HEAD', 'PATCH', 'OPTIONS');
    let count = 0;
    const codes = new Map<string, number>();
    await fc.assert(
      fc.asyncProperty(method, path, auth, body, async (m, p, authorization, b) => {
        count++;
        const r = await request(`${a.url}${p}`, {
          method: m as 'GET',
          headers: { ...(authorization ? { authorization } : {}), 'content-type': 'application/json' },
          ...(b !== undefined && m !== 'GET' && m !== 'HEAD' ? { body: b } : {}),
        });
        const text = await r.body.text();
        const proxied = r.headers['x-vsnap-engine'] !== undefined; // the engine's own answer, passed through
        expect(r.statusCode, `${m} ${p} -> ${r.statusCode} ${text.slice(0, 200)}`).toBeLessThan(500);
        if (r.statusCode >= 400 && !proxied && m !== 'HEAD') {
          const error = (JSON.parse(text) as { error?: { code?: unknown; vsnap_code?: unknown } }).error;
          const code = error?.vsnap_code ?? error?.code; // OpenAI routes: OpenAI's code, vsnap's beside it
          expect(code, `${m} ${p}: ${text}`).toMatch(/^E_[A-Z_]+$/);
          codes.set(String(code), (codes.get(String(code)) ?? 0) + 1);
        }
      }),
      { numRuns: Number(process.env.VSNAP_FUZZ_RUNS ?? 10_000) },
    );
    expect(count).toBe(Number(process.env.VSNAP_FUZZ_RUNS ?? 10_000));
    // the generators reach the rejections they are meant to
    for (const c of ['E_UNAUTHORIZED', 'E_NOT_FOUND', 'E_BAD_REQUEST', 'E_UNKNOWN_MODEL', 'E_INVALID_ARGUMENT', 'E_METHOD_NOT_ALLOWED']) expect(codes.get(c) ?? 0, c).toBeGreaterThan(0);
  });
});
