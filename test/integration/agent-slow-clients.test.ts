import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { captureEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapAgent, type SwapAgentOptions } from '../../src/serve/agent.js';
import { SwapController } from '../../src/swap/controller.js';
import { startEngine, type TestEngine } from '../helpers/engine.js';
import { pausedReader, raw, until } from '../helpers/net.js';

// Clients that stop reading or stop sending: none may hold an engine or the body budget for longer
// than the deadlines the agent is given (small here; the clients below never resume, so no timing is assumed).
const GB = 1e9;
const engines: Array<{ e: TestEngine; client: EngineClient; name: string }> = [];
let controller: SwapController;
let store: RegionStore;
let storeDir: string | undefined;
const agents: SwapAgent[] = [];

beforeAll(async () => {
  for (const name of ['model-a', 'model-b']) {
    const e = await startEngine({ seed: engines.length + 1, model: name });
    engines.push({ e, client: new EngineClient({ baseUrl: e.url, token: e.token }), name });
  }
  storeDir = mkdtempSync(join(tmpdir(), 'vsnap-slow-clients-')); // for the whole file (tempDir() is per test)
  store = await RegionStore.open(storeDir);
  for (const x of engines) await captureEngine(store, x.name, x.client); // each can be suspended and restored
  // room for one awake engine: the second model needs the first one suspended
  controller = await SwapController.create({ store, engines: engines.map((x) => ({ name: x.name, client: x.client, memoryBytes: 10 * GB })), budgets: { 0: 15 * GB }, queue: { timeoutMs: 600_000 } });
});
afterAll(async () => {
  for (const a of agents) await a.close({ graceMs: 0 });
  await controller?.close();
  for (const x of engines) {
    await x.client.close();
    await x.e.stop();
  }
  if (storeDir) rmSync(storeDir, { recursive: true, force: true });
});

async function agent(options: Partial<SwapAgentOptions> = {}): Promise<SwapAgent> {
  const a = await SwapAgent.listen({ controller, store, ...options });
  agents.push(a);
  return a;
}

const leases = (name: string): number => controller.states().find((s) => s.name === name)!.leases;

function post(url: string, path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown>; text: string }> {
  return request(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then(async (r) => {
    const text = await r.body.text();
    return { status: r.statusCode, json: JSON.parse(text.startsWith('{') ? text : '{}') as Record<string, unknown>, text };
  });
}


describe('slow readers and slow senders', () => {
  it('a client that stops reading its answer is cut after responseStallMs: its lease goes, and the other model swaps in and answers', async () => {
    const a = await agent({ responseStallMs: 300 });
    const reader = await pausedReader(a.url, 'model-a');
    expect(leases('model-a')).toBe(1);
    // model-b needs model-a suspended, which waits for model-a's lease: the agent lets it go once
    // the reader has read nothing for 300 ms with bytes waiting
    const r = await post(a.url, '/v1/completions', { model: 'model-b', prompt: 'The capital of France is', max_tokens: 2 });
    expect(r.status, r.text).toBe(200);
    expect(leases('model-a')).toBe(0);
    reader.socket.resume(); // what reached it, then the end: the agent closed the connection
    await reader.closed;
  });

  it('close() waits for answers being sent at most graceMs, then closes what is left (a paused reader cannot hold a shutdown)', async () => {
    const a = await SwapAgent.listen({ controller, store, responseStallMs: 600_000 });
    const reader = await pausedReader(a.url, 'model-b');
    expect(leases('model-b')).toBe(1);
    await a.close({ graceMs: 200 }); // returns: the connection still being answered is closed after 200 ms
    await until(() => leases('model-b') === 0);
    reader.socket.resume();
    await reader.closed;
  });

  it('eight senders that stall just under a full body each fill the budget: they are cut at bodyStallMs (408) and a good client waiting for room is served', async () => {
    const MAX = 32 * 1024; // the defaults scaled down 1024x: 8 bodies of one byte less than the largest fill the budget
    const a = await agent({ maxBodyBytes: MAX, maxInFlightBodyBytes: 8 * MAX, bodyStallMs: 300 });
    const attackers = Array.from({ length: 8 }, () => raw(a.url));
    for (const t of attackers) t.socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${MAX}\r\n\r\n${'{'.padEnd(MAX - 1, ' ')}`);
    await until(() => a.bodyReads().heldBytes === 8 * (MAX - 1));
    const good = await post(a.url, '/v1/completions', { model: 'model-b', prompt: 'The capital of France is', max_tokens: 2, pad: 'p'.repeat(100) });
    expect(good.status, good.text).toBe(200);
    await Promise.all(attackers.map((t) => t.closed));
    for (const t of attackers) {
      expect(t.received()).toMatch(/^HTTP\/1\.1 408 /);
      expect(t.received()).toContain('E_REQUEST_TIMEOUT');
    }
    await until(() => a.bodyReads().heldBytes === 0 && a.bodyReads().requests === 0);
  });

  it('when every body being read waits for room and nothing else holds any, none can come: the newest gets 429 at once and the older then fits', async () => {
    const a = await agent({ maxBodyBytes: 2000, maxInFlightBodyBytes: 3000, bodyStallMs: 600_000 });
    const head = (n: number): string => `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${n}\r\n\r\n`;
    const first = raw(a.url);
    const second = raw(a.url);
    const pre = '{"model":"nope","pad":"';
    first.socket.write(head(1600) + pre + 'a'.repeat(1500 - pre.length));
    await until(() => a.bodyReads().heldBytes === 1500);
    second.socket.write(head(1600) + pre + 'b'.repeat(1500 - pre.length));
    await until(() => a.bodyReads().heldBytes === 3000); // full: each holds 1500
    first.socket.write('a'.repeat(98) + '"}'); // does not fit: waits for the second, which still sends
    await until(() => a.bodyReads().waiting === 1);
    second.socket.write('b'.repeat(98) + '"}'); // now both wait: a deadlock, broken at once
    await second.closed;
    expect(second.received()).toMatch(/^HTTP\/1\.1 429 /);
    expect(second.received()).toContain('E_OVERLOADED');
    await until(() => first.received().length > 0); // its bytes then fit: read and answered (an unknown model)
    expect(first.received()).toMatch(/^HTTP\/1\.1 404 /);
    first.socket.destroy();
    await until(() => a.bodyReads().heldBytes === 0);
  });
});

describe('OpenAI routes', () => {
  it('an unknown model answers OpenAI model_not_found, with vsnap code beside it, on every OpenAI route', async () => {
    const a = await agent();
    const expected = { type: 'invalid_request_error', param: 'model', code: 'model_not_found', vsnap_code: 'E_UNKNOWN_MODEL' };
    for (const path of ['/v1/completions', '/v1/chat/completions']) {
      const r = await post(a.url, path, { model: 'nope', prompt: 'x', messages: [{ role: 'user', content: 'x' }] });
      expect(r.status, path).toBe(404);
      expect((r.json as { error: object }).error, path).toMatchObject(expected);
    }
    const m = await request(`${a.url}/v1/models/nope`);
    expect(m.statusCode).toBe(404);
    expect(((await m.body.json()) as { error: object }).error).toMatchObject({ ...expected, message: "The model 'nope' does not exist" });
    // off the OpenAI routes, vsnap's own shape
    const c = await request(`${a.url}/engines/nope/restore`, { method: 'POST' });
    expect(((await c.body.json()) as { error: { code: string } }).error.code).toBe('E_CONTROL_OFF');
  });

  it('stream_options.include_usage: the stream ends with a chunk that has the usage and no choices, as vLLM sends it', async () => {
    const a = await agent();
    for (const [path, extra] of [['/v1/completions', { prompt: 'The capital of France is' }], ['/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }]] as const) {
      const r = await post(a.url, path, { model: 'model-a', max_tokens: 3, stream: true, stream_options: { include_usage: true }, ...extra });
      expect(r.status, r.text).toBe(200);
      const events = r.text.split('\n\n').filter((e) => e.startsWith('data: ') && !e.includes('[DONE]')).map((e) => JSON.parse(e.slice(6)) as { choices: unknown[]; usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number } });
      const last = events.at(-1)!;
      expect(last.choices, path).toEqual([]);
      expect(last.usage, path).toMatchObject({ completion_tokens: 3 });
      expect(last.usage!.total_tokens).toBe(last.usage!.prompt_tokens + 3);
      expect(events.slice(0, -1).every((e) => e.choices.length === 1 && e.usage == null), path).toBe(true);
      const plain = await post(a.url, path, { model: 'model-a', max_tokens: 3, stream: true, ...extra });
      const plainEvents = plain.text.split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as { choices: unknown[]; usage?: unknown });
      expect(plainEvents.every((e) => e.choices.length === 1 && e.usage == null), `${path} without stream_options`).toBe(true);
    }
  });

  it('a Host the agent does not answer: the 403 names the host name without its port, as allowedHosts takes it', async () => {
    const a = await agent({ allowedHosts: ['example.com'] });
    const ok = await request(`${a.url}/healthz`, { headers: { host: 'example.com:8080' } });
    expect(ok.statusCode).toBe(200);
    await ok.body.dump();
    const r = await request(`${a.url}/healthz`, { headers: { host: 'other.example:8080' } });
    expect(r.statusCode).toBe(403);
    const msg = ((await r.body.json()) as { error: { message: string } }).error.message;
    expect(msg).toContain('add "other.example" (the name, without a port) to listen.allowedHosts');
    expect(msg).not.toContain('add "other.example:8080"');
  });
});
