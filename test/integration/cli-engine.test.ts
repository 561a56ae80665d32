import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { request } from 'undici';
import { describe, expect, it } from 'vitest';

import { packageRoot } from '../../src/native/index.js';
import { cliPath, runCli } from '../helpers/cli.js';
import { pluginSitePath, startEngine } from '../helpers/engine.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

describe('vsnap commands on an engine', () => {
  it('status, snapshot, suspend, restore', async () => {
    const engine = await startEngine();
    try {
      const store = ['--store', join(tempDir(), 's')];
      const env = { VSNAP_ENGINE_URL: engine.url, VSNAP_TOKEN: engine.token };
      const status = await runCli(['status', '--json'], env);
      expect(status.code).toBe(0);
      expect(JSON.parse(status.stdout)).toMatchObject({ sleeping: false, engine: { kind: 'vllm' } });
      const refused = await runCli(['suspend', 'ref', ...store], env);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/\[E_NOT_RESTORABLE\]/);
      const snap = await runCli(['snapshot', 'ref', ...store, '--json'], env);
      expect(JSON.parse(snap.stdout)).toMatchObject({ cached: false });
      expect(JSON.parse((await runCli(['snapshot', 'ref', ...store, '--json'], env)).stdout)).toMatchObject({ cached: true });
      // stored coded: the suspend and the restore below use these blobs
      const coded = await runCli(['snapshot', 'ref', ...store, '--force', '--codec', 'vsnap-c1'], env);
      expect(coded.stdout).toMatch(/captured ref .*, stored coded in \S+ \S+ \(0\.\d\dx\)$/m);
      expect((await runCli(['snapshot', 'ref', ...store, '--force', '--codec', 'zstd'], env)).code).toBe(2);
      // --deep without the driver's process checkpoint API (no GPU here): refused before anything changes
      const deep = await runCli(['suspend', 'ref', ...store, '--deep'], env);
      expect(deep.code).toBe(1);
      expect(deep.stderr).toMatch(/\[E_CHECKPOINT_UNSUPPORTED\][\s\S]*suspend without --deep/);
      expect(JSON.parse((await runCli(['status', '--json'], env)).stdout)).toMatchObject({ sleeping: false });
      expect((await runCli(['suspend', 'ref', ...store], env)).stdout).toMatch(/suspended in/);
      // --onto reaches restoreEngine: the host-memory reference engine has no GPU to move, refused before anything changes
      const onto = await runCli(['restore', 'ref', ...store, '--onto', '1'], env);
      expect(onto.code).toBe(1);
      expect(onto.stderr).toMatch(/\[E_INVALID_ARGUMENT\][\s\S]*host memory/);
      const restored = await runCli(['restore', 'ref', ...store], env);
      expect(restored.code).toBe(0);
      expect(restored.stdout).toMatch(/restored ref: .* from the store tier .*expectedResponse/);
      expect((await runCli(['status'], { VSNAP_TOKEN: engine.token })).stderr).toMatch(/needs --engine/);
      expect((await runCli(['status', '--engine', engine.url], { VSNAP_TOKEN: 'wrong' })).stderr).toMatch(/\[E_ENGINE_HTTP\].*401/);
    } finally {
      await engine.stop();
    }
  });

  it('doctor --engine says how the routes got there, the bridge state and memory kinds, or why there are no routes', async () => {
    const store = ['--store', join(tempDir(), 's')];
    const ok = await startEngine();
    const none = await startEngine({ env: { VSNAP_REF_NO_BUILD_APP: '1' } });
    const rocm = await startEngine({ env: { VSNAP_REF_ROCM_HANDLES: '1' } });
    try {
      const a = await runCli(['doctor', ...store, '--engine', ok.url], { VSNAP_TOKEN: ok.token });
      expect(a.stdout).toMatch(/engine routes: endpoint_plugins/);
      expect(a.stdout).toMatch(/engine bridge: ok \(weights memory: \d+ none\)/);
      const b = await runCli(['doctor', ...store, '--engine', none.url, '--json'], { VSNAP_TOKEN: none.token });
      expect(b.code).toBe(1);
      expect(JSON.parse(b.stdout).engine).toMatchObject({ ok: false, routes: { mechanism: null } });
      expect(JSON.parse(b.stdout).engine.routes.detail).toMatch(/using the dev routes/);
      const c = await runCli(['doctor', ...store, '--engine', rocm.url], { VSNAP_TOKEN: rocm.token });
      expect(c.code).toBe(1);
      expect(c.stdout).toMatch(/engine bridge: DISABLED: rank 0: .*ROCm/);
    } finally {
      await Promise.all([ok.stop(), none.stop(), rocm.stop()]);
    }
  });

  it('vsnap serve: boots engines from a config one at a time, routes requests, swaps, stops them', async () => {
    const dir = tempDir();
    const [agentPort, p1, p2] = [await freePort(), await freePort(), await freePort()];
    const serve = join(packageRoot(), 'test', 'fixtures', 'engine', 'serve.py');
    const env = { PYTHONPATH: pluginSitePath(), VLLM_PLUGINS: 'vsnap' };
    const model = (port: number, seed: number) => ({
      command: 'python3',
      args: [serve, '--device', 'host', '--port', '${PORT}', '--seed', String(seed), '--model', `m${seed}`, '--enable-sleep-mode'],
      env,
      port,
      token: '${env:ENGINE_TOKEN}',
      memoryGiB: 10,
    });
    const config = {
      listen: { port: agentPort },
      store: join(dir, 'store'),
      controlToken: 'ctl',
      gpus: { 0: { budgetGiB: 15 } },
      defaultModel: 'm1',
      models: { m1: model(p1, 1), m2: model(p2, 2) },
    };
    const file = join(dir, 'vsnap.json');
    writeFileSync(file, JSON.stringify(config, null, 2));
    const child = spawn(process.execPath, [cliPath, 'serve', '--config', file], { env: { ...process.env, ENGINE_TOKEN: 'engine-secret' }, stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    child.stderr.on('data', (d: Buffer) => (log += d.toString()));
    try {
      await new Promise<void>((resolve, reject) => {
        const t = setInterval(() => {
          if (/serving m1, m2/.test(log)) resolve(clearInterval(t));
          if (child.exitCode !== null) reject(new Error(log));
        }, 50);
      });
      expect(log.indexOf('m1 is up and suspended (snapshot captured)')).toBeLessThan(log.indexOf('m2 is up and suspended'));
      for (const m of ['m2', 'm1', 'm2']) {
        const r = await request(`http://127.0.0.1:${agentPort}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: m, prompt: 'hi', max_tokens: 2 }),
        });
        expect(r.statusCode).toBe(200);
        expect(r.headers['x-vsnap-engine']).toBe(m);
        await r.body.dump();
      }
      const swap = await runCli(['swap', 'm1', '--agent', `http://127.0.0.1:${agentPort}`, '--token', 'ctl']);
      expect(swap.stdout).toMatch(/m1 is awake/);
      // a model the agent does not serve: its own code and a hint that helps, not one about the token
      const unknown = await runCli(['swap', 'nope', '--agent', `http://127.0.0.1:${agentPort}`, '--token', 'ctl']);
      expect(unknown.code).toBe(1);
      expect(unknown.stderr).toMatch(/\[E_UNKNOWN_MODEL\].*answered 404: no engine serves 'nope'/);
      expect(unknown.stderr).toMatch(/hint: .*GET \/v1\/models/);
      expect(unknown.stderr).not.toMatch(/--token/);
      const refused = await runCli(['swap', 'm1', '--agent', `http://127.0.0.1:${agentPort}`, '--token', 'wrong']);
      expect(refused.stderr).toMatch(/answered 401[\s\S]*hint: pass the agent's control token with --token/);
      expect(log).toMatch(/restore m2 in \d+ ms/);
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.on('exit', r));
    }
    expect(log).toMatch(/vsnap: stopping/);
    // the engines it started are gone
    for (const port of [p1, p2]) await expect(request(`http://127.0.0.1:${port}/health`)).rejects.toThrow();
  });

  it('vsnap serve refuses a bad configuration with the file and line', async () => {
    const file = join(tempDir(), 'bad.yaml');
    writeFileSync(file, 'store: /tmp/x\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n  m: { url: "http://127.0.0.1:1", memoryGiB: -3 }\n');
    const r = await runCli(['serve', '--config', file]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/\[E_CONFIG\].*bad\.yaml:4:\d+ models\.m\.memoryGiB/s);
  });
});
