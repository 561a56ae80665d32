import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import { freePort } from '../helpers/net.js';
import { groupMembers, recordedEngines, referenceServeConfig, startServe, until, type ServeProcess } from '../helpers/serve-process.js';
import { tempDir } from '../helpers/tmp.js';

// Engines must not outlive `vsnap serve` (issue 23): whatever ends it (SIGKILL, SIGTERM or
// SIGHUP during the boot), no engine is left running and the next start succeeds.

const running: ServeProcess[] = [];
const groups: number[] = [];
afterEach(async () => {
  for (const s of running.splice(0)) {
    if (s.child.exitCode === null && s.child.signalCode === null) {
      s.child.kill('SIGTERM');
      await s.exited;
    }
  }
  for (const g of groups.splice(0)) {
    try {
      process.kill(-g, 'SIGKILL'); // a test that failed may have left them: never leave them to the next
    } catch {
      // gone
    }
  }
});

function serveProcess(file: string, stateHome: string): ServeProcess {
  const s = startServe(file, stateHome);
  running.push(s);
  return s;
}

async function completes(listenPort: number, model: string): Promise<void> {
  const r = await request(`http://127.0.0.1:${listenPort}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'The capital of France is', max_tokens: 2 }),
  });
  expect(r.statusCode, await r.body.text()).toBe(200);
}

describe('vsnap serve: no engine outlives it', () => {
  it('SIGKILL of a booted serve: every engine process exits with it, and a restart with the same configuration serves', async () => {
    const dir = tempDir();
    const { file, listenPort, ports } = await referenceServeConfig(dir, 2);
    const first = serveProcess(file, dir);
    await first.waitFor(/serving m1, m2/);
    const engines = recordedEngines(dir);
    expect(engines.map((e) => e.name).sort()).toEqual(['m1', 'm2']);
    groups.push(...engines.map((e) => e.pid));
    expect(engines.every((e) => groupMembers(e.pid).length > 0)).toBe(true);
    first.child.kill('SIGKILL');
    await first.exited;
    // the parent-death signal stops each engine (and the engine its engine-core process), before any restart
    await until(() => engines.every((e) => groupMembers(e.pid).length === 0));
    for (const port of ports) await expect(request(`http://127.0.0.1:${port}/health`)).rejects.toThrow();
    const second = serveProcess(file, dir);
    await second.waitFor(/serving m1, m2/);
    await completes(listenPort, 'm2');
    expect(second.log()).not.toMatch(/E_ADDRESS_IN_USE/);
  });

  it('engines a dead serve left running (no parent-death signal) are stopped by the next start, which then serves', async () => {
    const dir = tempDir();
    const { file, listenPort } = await referenceServeConfig(dir, 2);
    // a serve whose engines do not get the signal (as on a machine without setpriv and python3)
    const host = join(dir, 'host.mts');
    writeFileSync(
      host,
      `import { loadConfig } from ${JSON.stringify(join(process.cwd(), 'src/serve/config.ts'))};
      import { serve } from ${JSON.stringify(join(process.cwd(), 'src/serve/serve.ts'))};
      const h = await serve(loadConfig(${JSON.stringify(file)}), { parentDeathSignal: false, log: (l) => console.error(l) });
      await h.booted;
      console.error('booted');
      setInterval(() => {}, 1000);`,
    );
    const child = spawn(process.execPath, ['--import', 'tsx', host], { env: { ...process.env, XDG_STATE_HOME: dir }, stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    child.stderr.on('data', (d: Buffer) => (log += d.toString()));
    const exited = new Promise((r) => child.once('exit', r));
    await until(() => log.includes('booted') || child.exitCode !== null);
    expect(log).toContain('booted');
    const engines = recordedEngines(dir);
    groups.push(...engines.map((e) => e.pid));
    expect(engines).toHaveLength(2);
    child.kill('SIGKILL');
    await exited;
    expect(engines.every((e) => groupMembers(e.pid).length > 0)).toBe(true); // left running, holding their ports
    const second = serveProcess(file, dir);
    await second.waitFor(/serving m1, m2/);
    for (const e of engines) {
      expect(second.log()).toMatch(new RegExp(`stopped engine '${e.name}' \\(pid ${e.pid}, \\d+ process\\(es\\)`));
      expect(groupMembers(e.pid)).toEqual([]);
    }
    await completes(listenPort, 'm1');
  });

  it('an engine that cannot boot: serve says so, stops what it started and exits 1, leaving no record', async () => {
    const dir = tempDir();
    const { file } = await referenceServeConfig(dir, 1);
    const config = JSON.parse(readFileSync(file, 'utf8')) as { models: Record<string, Record<string, unknown>> };
    config.models.bad = { command: process.execPath, args: ['-e', "console.error('no weights here'); process.exit(3)"], port: await freePort(), memoryGiB: 1 };
    writeFileSync(file, JSON.stringify(config));
    const s = serveProcess(file, dir);
    const { code } = await s.exited;
    expect(code, s.log()).toBe(1);
    expect(s.log()).toMatch(/\[E_ENGINE_STATE\] engine 'bad' exited \(code 3\) before it was healthy/);
    expect(s.log()).toContain('[bad] no weights here');
    const spawned = [...s.log().matchAll(/vsnap: (\w+): engine process (\d+) started/g)].map((m) => Number(m[2]));
    for (const pid of spawned) expect(groupMembers(pid)).toEqual([]);
    expect(recordedEngines(dir)).toEqual([]);
  });

  for (const signal of ['SIGTERM', 'SIGHUP'] as const) {
    it(`${signal} during the boot stops the engines started so far and starts no other; exit 0`, async () => {
      const dir = tempDir();
      const { file } = await referenceServeConfig(dir, 3);
      const s = serveProcess(file, dir);
      // the boot is under way: the first engine's process is recorded (deterministic, no sleep)
      await until(() => recordedEngines(dir).length > 0 || s.child.exitCode !== null);
      expect(recordedEngines(dir)[0]!.name).toBe('m1');
      s.child.kill(signal);
      const { code } = await s.exited;
      expect(code, s.log()).toBe(0);
      expect(s.log()).toMatch(new RegExp(`stopping the agent and the engines \\(${signal}\\)`));
      // every engine process it started (logged as it starts), and none after the signal
      const spawned = [...s.log().matchAll(/vsnap: (m\d): engine process (\d+) started/g)].map((m) => ({ name: m[1]!, pid: Number(m[2]) }));
      groups.push(...spawned.map((e) => e.pid));
      expect(spawned[0]!.name).toBe('m1');
      expect(spawned.map((e) => e.name)).not.toContain('m3'); // m2 may have started if m1 was done by then; m3 never
      for (const e of spawned) expect(groupMembers(e.pid), e.name).toEqual([]);
      expect(recordedEngines(dir)).toEqual([]); // a clean stop leaves no record
    });
  }
});
