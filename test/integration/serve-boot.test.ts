import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';

import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import { packageRoot } from '../../src/native/index.js';
import { parseConfig } from '../../src/serve/config.js';
import { serve, type ServeHandle } from '../../src/serve/serve.js';
import { pluginSitePath, startEngine, type TestEngine } from '../helpers/engine.js';
import { freePort } from '../helpers/net.js';
import { until } from '../helpers/serve-process.js';
import { tempDir } from '../helpers/tmp.js';

// A model's preparation never holds up vsnap serve's listener (issue 23): a registry that accepts
// connections and never answers stalls that model's pull; serve listens anyway, serves the other
// models, reports this one not ready with the reason (healthz, status, 503 E_NOT_READY) and logs
// the pull's progress.

/**
 * A "registry" that answers every request with the headers of a body (within the client's limit
 * for a manifest, 4 MiB, so it is read) and then a byte at a time, never finishing: a pull that
 * stalls for good within the test (no stall deadline fires, as bytes keep coming), whatever the
 * machine's speed.
 */
async function stallingRegistry(): Promise<{ url: string; requests: () => number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  let seen = 0;
  const answered = new Set<Socket>();
  const trickle = setInterval(() => answered.forEach((s) => s.write(' ')), 200);
  const server: Server = createServer((s) => {
    sockets.add(s);
    s.once('data', () => {
      seen++;
      s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n');
      answered.add(s);
    });
    s.on('error', () => undefined);
    s.on('close', () => {
      sockets.delete(s);
      answered.delete(s);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    requests: () => seen,
    close: async () => {
      clearInterval(trickle);
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function complete(url: string, model: string): Promise<{ status: number; body: { error?: { code: string; message: string } } }> {
  const r = await request(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt: 'The capital of France is', max_tokens: 2 }) });
  return { status: r.statusCode, body: (await r.body.json()) as { error?: { code: string; message: string } } };
}

async function healthz(url: string): Promise<{ status: string; degraded?: Array<{ engine: string; reason: string }> }> {
  return (await (await request(`${url}/healthz`)).body.json()) as { status: string; degraded?: Array<{ engine: string; reason: string }> };
}

describe('vsnap serve: a stalled pull holds up only its own model', () => {
  it('an engine it starts whose registry stalls: serve listens, the other model is served, this one is not ready (pulling, with the reason), progress is logged; close() ends the pull', async () => {
    const reg = await stallingRegistry();
    cleanups.push(reg.close);
    const serveScript = join(packageRoot(), 'test', 'fixtures', 'engine', 'serve.py');
    const model = async (seed: number, extra = '') =>
      `    command: python3\n    args: [${serveScript}, --device, host, --port, "\${PORT}", --seed, "${seed}", --model, m${seed}, --enable-sleep-mode, --layers, "2"]\n` +
      `    env: { PYTHONPATH: ${pluginSitePath()}, VLLM_PLUGINS: vsnap }\n    port: ${await freePort()}\n    token: engine-token-${seed}\n    memoryGiB: 10\n${extra}`;
    const reference = `${reg.url}/team/stuck:v1`;
    // 'stuck' is listed first: the engines that need a pull boot last, so it cannot hold up 'fine'
    const config = parseConfig(`listen: { port: 0 }\nstore: ${tempDir()}\ngpus: { "0": { budgetGiB: 25 } }\nmodels:\n  stuck:\n${await model(2, `    registry: ${reference}\n`)}  fine:\n${await model(1)}`, 'test.yaml');
    const lines: string[] = [];
    const handle: ServeHandle = await serve(config, { log: (l) => lines.push(l), stateDir: tempDir(), pullStallLogMs: 200 });
    let closed = false;
    cleanups.push(async () => {
      if (!closed) await handle.close();
    });
    const url = handle.agent.url;
    await until(() => reg.requests() > 0); // the pull reached the registry, which never finishes answering
    expect(lines.filter((l) => /stuck: pulling snapshot .* failed/.test(l))).toEqual([]);
    expect((await healthz(url)).degraded).toEqual([{ engine: 'stuck', reason: expect.stringMatching(/^not ready \(pulling\)/) }]);
    let bootSettled = false;
    handle.booted.then(() => (bootSettled = true), () => (bootSettled = true));
    expect(handle.readiness.get('fine')).toMatchObject({ ready: true });
    expect(handle.readiness.get('stuck')).toMatchObject({ ready: false, phase: 'pulling', reason: expect.stringContaining(`pulling its snapshot from ${reference}`) });
    expect(lines).toContain(`vsnap: stuck: pulling snapshot 'stuck' from ${reference}`);
    const fineUp = lines.findIndex((l) => l.startsWith('vsnap: fine is up and suspended'));
    expect(fineUp).toBeGreaterThanOrEqual(0);
    expect(fineUp).toBeLessThan(lines.indexOf(`vsnap: stuck: pulling snapshot 'stuck' from ${reference}`));

    const health = await healthz(url);
    expect(health.status).toBe('degraded');
    expect(health.degraded).toEqual([{ engine: 'stuck', reason: expect.stringMatching(/^not ready \(pulling\): pulling its snapshot from http:\/\/127\.0\.0\.1:\d+\/team\/stuck:v1/) }]);
    const status = (await (await request(`${url}/api/status`)).body.json()) as { engines: Array<{ name: string; readiness?: { ready: boolean; phase: string } }> };
    expect(status.engines.find((e) => e.name === 'stuck')?.readiness).toMatchObject({ ready: false, phase: 'pulling' });

    expect((await complete(url, 'fine')).status).toBe(200);
    const refused = await complete(url, 'stuck');
    expect(refused.status).toBe(503);
    expect(refused.body.error).toMatchObject({ code: 'E_NOT_READY', message: expect.stringMatching(/^'stuck' is not ready: pulling its snapshot from .*; retry later$/) });
    // the stall is said, in the log and the reason
    await until(() => lines.some((l) => /^vsnap: stuck: pulling its snapshot from .*; no progress for \d+ s$/.test(l)));
    expect(handle.readiness.get('stuck')!.reason).toMatch(/no progress for \d+ s/);
    await new Promise((r) => setImmediate(r));
    expect(bootSettled).toBe(false); // the boot waits on the pull, the agent does not

    const pid = handle.supervisor.pid('stuck')!;
    closed = true;
    await handle.close(); // ends the pull, stops both engines
    await expect(handle.booted).rejects.toMatchObject({ code: 'E_ABORTED' });
    expect(() => process.kill(pid, 0)).toThrow();
  });

  it('an engine already running whose registry stalls: serve listens and serves the other model; this one answers 503 E_NOT_READY until its pull ends', async () => {
    const reg = await stallingRegistry();
    cleanups.push(reg.close);
    const engines: TestEngine[] = await Promise.all([startEngine({ seed: 1, model: 'a' }), startEngine({ seed: 2, model: 'b' })]);
    cleanups.push(async () => void (await Promise.all(engines.map((e) => e.stop()))));
    const [a, b] = engines as [TestEngine, TestEngine];
    const config = parseConfig(
      `listen: { port: 0 }\nstore: ${tempDir()}\ngpus: { "0": { budgetGiB: 25 } }\nmodels:\n` +
        `  stuck:\n    url: ${b.url}\n    token: ${b.token}\n    registry: ${reg.url}/team/b:v1\n    memoryGiB: 10\n` +
        `  fine:\n    url: ${a.url}\n    token: ${a.token}\n    memoryGiB: 10\n`,
      'test.yaml',
    );
    const handle = await serve(config, { log: () => undefined, stateDir: tempDir() });
    cleanups.push(() => handle.close());
    await until(() => reg.requests() > 0);
    expect((await complete(handle.agent.url, 'fine')).status).toBe(200);
    const refused = await complete(handle.agent.url, 'stuck');
    expect(refused).toMatchObject({ status: 503, body: { error: { code: 'E_NOT_READY' } } });
    expect((await healthz(handle.agent.url)).degraded).toEqual([{ engine: 'stuck', reason: expect.stringMatching(/^not ready \(pulling\)/) }]);
  });
});
