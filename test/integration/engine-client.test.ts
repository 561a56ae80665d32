import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { startEngine, type TestEngine } from '../helpers/engine.js';

const cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0)) await c();
});

async function engine(options: Parameters<typeof startEngine>[0] = {}) {
  const e = await startEngine(options);
  cleanup.push(() => e.stop());
  return e;
}

function client(url: string, options: Partial<ConstructorParameters<typeof EngineClient>[0]> = {}) {
  const c = new EngineClient({ baseUrl: url, ...options });
  cleanup.push(() => c.close());
  return c;
}

/** A plain HTTP server answering with `handler`, counting requests. */
async function fakeServer(handler: (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => void) {
  let hits = 0;
  const server: Server = createServer((req, res) => {
    hits++;
    handler(req, res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanup.push(() => new Promise<void>((r) => {
    server.closeAllConnections();
    server.close(() => r());
  }));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits: () => hits };
}

describe('EngineClient against the reference engine', () => {
  let e: TestEngine;

  it('speaks vLLM\'s routes and the vsnap routes', async () => {
    e = await engine();
    const c = client(e.url, { token: e.token });
    expect(await c.health()).toBe(true);
    expect(await c.version()).toBe('0.0.0+vsnap.reference');
    expect(await c.models()).toEqual(['vsnap/reference-host-1']);
    const completion = await c.completions({ prompt: 'hi', max_tokens: 5, logprobs: 1 });
    expect(completion.tokenIds).toHaveLength(5);
    expect(completion.logprobs).toHaveLength(5);
    expect(completion.text).toMatch(/^( t\d+){5}$/);

    expect(await c.wire.isSleeping()).toBe(false);
    await c.wire.sleep({ level: 1 });
    expect(await c.wire.isSleeping()).toBe(true);
    await c.wire.wakeUp({ tags: ['weights'] });
    expect(await c.wire.isSleeping()).toBe(true);
    await c.wire.wakeUp();
    expect(await c.wire.isSleeping()).toBe(false);
    const ranks = await c.wire.collectiveRpc('vsnap_status');
    expect(ranks).toEqual([expect.objectContaining({ rank: 0, memory: 'host' })]);
    // vLLM's rpc route (vllm/entrypoints/serve/dev/rpc/api_router.py): None results are kept, one per worker
    expect(await c.wire.collectiveRpc('discard', { kwargs: { tags: [] } })).toEqual([null]);
    expect(await c.wire.collectiveRpc('ref_reset_prefix_cache')).toEqual(['True']); // non-dict/list results are str()-ed
    await c.wire.resetPrefixCache();

    const status = await c.wire.vsnapStatus();
    expect(status).toMatchObject({ sleeping: false, engine: { kind: 'vllm' }, model: { id: 'vsnap/reference-host-1' } });
  });

  it('accepts the older empty-200 answers of sleep and wake_up', async () => {
    e = await engine({ env: { VSNAP_REF_LEGACY_ROUTES: '1' } });
    const c = client(e.url, { token: e.token });
    await c.wire.sleep({ level: 2 });
    expect(await c.wire.isSleeping()).toBe(true);
    await c.wire.wakeUp();
    expect(await c.wire.isSleeping()).toBe(false);
  });

  it('401 without the right token, 503 when the engine has none, a hint when the plugin or dev mode is off', async () => {
    e = await engine();
    await expect(client(e.url).wire.vsnapStatus()).rejects.toMatchObject({ code: 'E_ENGINE_HTTP', details: { status: 401, route: 'GET /vsnap/v1/status' } });
    await expect(client(e.url, { token: 'wrong' }).wire.vsnapSleep({ level: 2 })).rejects.toMatchObject({ code: 'E_ENGINE_HTTP', details: { status: 401 } });
    expect(await client(e.url, { token: e.token }).wire.isSleeping()).toBe(false); // nothing slept

    const noToken = await engine({ token: null });
    await expect(client(noToken.url, { token: 'anything' }).wire.vsnapStatus()).rejects.toMatchObject({
      code: 'E_ENGINE_HTTP',
      details: { status: 503 },
      message: expect.stringMatching(/VSNAP_TOKEN is not set/),
    });
    const noPlugin = await engine({ plugin: false, devMode: false });
    await expect(client(noPlugin.url).wire.vsnapStatus()).rejects.toMatchObject({ details: { status: 404 }, message: expect.stringMatching(/VLLM_PLUGINS=vsnap/) });
    await expect(client(noPlugin.url).wire.isSleeping()).rejects.toMatchObject({ details: { status: 404 }, message: expect.stringMatching(/VLLM_SERVER_DEV_MODE/) });
  });

  it("a user's operations pick the plugin's routes, or vLLM's dev routes where the plugin added none; neither is E_ENGINE_STATE", async () => {
    for (const [options, via] of [[{ devMode: false }, 'vsnap'], [{ env: { VSNAP_REF_NO_BUILD_APP: '1' } }, 'dev']] as const) {
      e = await engine(options);
      const c = client(e.url, { token: e.token });
      const before = await c.status();
      expect(before).toMatchObject({ sleeping: false, model: { id: 'vsnap/reference-host-1' } });
      expect(before.routes?.mechanism ?? null).toEqual(via === 'vsnap' ? 'endpoint_plugins' : null);
      const table = await c.describe();
      expect(table[0]!.regions.length).toBeGreaterThan(0);
      const expected = await c.expectedResponse({ maxTokens: 4 });
      await c.sleep({ level: 1 });
      expect((await c.status()).sleeping).toBe(true);
      expect(await c.describe()).toEqual(table); // the table is there while asleep
      await c.wake({ tags: ['weights'] });
      await c.wake();
      expect((await c.status()).sleeping).toBe(false);
      await c.resetPrefixCache();
      expect(await c.expectedResponse({ maxTokens: 4 })).toEqual(expected);
    }
    await expect(client(e.url).sleep({ levle: 2 } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/did you mean 'level'/) });
    const neither = await engine({ plugin: false, devMode: false });
    await expect(client(neither.url).status()).rejects.toMatchObject({ code: 'E_ENGINE_STATE', message: expect.stringMatching(/VLLM_SERVER_DEV_MODE=1/) });
  });

  it('sends the API key on /v1 routes', async () => {
    e = await engine({ env: { VLLM_API_KEY: 'sk-test' } });
    await expect(client(e.url).models()).rejects.toMatchObject({ details: { status: 401 } });
    expect(await client(e.url, { apiKey: 'sk-test' }).models()).toHaveLength(1);
  });
});

describe('EngineClient failures', () => {
  it('E_ENGINE_UNREACHABLE for a closed port', async () => {
    const server = await fakeServer((_req, res) => res.end());
    const port = new URL(server.url).port;
    await cleanup.splice(-1, 1)[0]!(); // close it now: resolves once the server stopped listening
    await expect(client(`http://127.0.0.1:${port}`, { retries: 2 }).version()).rejects.toMatchObject({
      code: 'E_ENGINE_UNREACHABLE',
      message: expect.stringMatching(/Is it running/),
    });
  });

  it('retries GETs on 503 but never POSTs', async () => {
    const server = await fakeServer((_req, res) => {
      res.statusCode = 503;
      res.end('busy');
    });
    await expect(client(server.url, { retries: 2 }).version()).rejects.toMatchObject({ code: 'E_ENGINE_HTTP', details: { status: 503, body: 'busy' } });
    expect(server.hits()).toBe(3);
    await expect(client(server.url, { retries: 2, token: 't' }).wire.vsnapSleep({ level: 2 })).rejects.toMatchObject({ code: 'E_ENGINE_HTTP' });
    expect(server.hits()).toBe(4);
  });

  it('E_ENGINE_PROTOCOL for answers of the wrong shape', async () => {
    const server = await fakeServer((_req, res) => res.end(JSON.stringify({ is_sleeping: 'maybe' })));
    await expect(client(server.url).wire.isSleeping()).rejects.toMatchObject({ code: 'E_ENGINE_PROTOCOL', details: { route: '/is_sleeping' } });
    const html = await fakeServer((_req, res) => res.end('<html>proxy error</html>'));
    await expect(client(html.url).version()).rejects.toMatchObject({ code: 'E_ENGINE_PROTOCOL', message: expect.stringMatching(/not JSON/) });
  });

  it('E_TIMEOUT and E_ABORTED', async () => {
    const server = await fakeServer(() => undefined); // never answers
    await expect(client(server.url, { retries: 0 }).version({ timeoutMs: 200 })).rejects.toMatchObject({ code: 'E_TIMEOUT' });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    await expect(client(server.url).version({ signal: controller.signal })).rejects.toMatchObject({ code: 'E_ABORTED' });
  });

  it('rejects a bad base URL', () => {
    expect(() => new EngineClient({ baseUrl: 'localhost:8000' })).toThrowError(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
  });
});
