import { execFile, spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { afterEach, describe, expect, it } from 'vitest';

import { Supervisor } from '../../src/serve/supervisor.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0)) await c();
});

/** A tiny engine: serves /health; with `crashOnRequest`, a request to /crash makes its first run (marker file) exit 1. */
function fakeEngine(port: number, options: { marker?: string; crashOnRequest?: boolean; alwaysCrash?: boolean; ignoreTerm?: boolean } = {}) {
  const script = `
    const fs = require('fs');
    const first = ${JSON.stringify(options.marker ?? '')} && !fs.existsSync(${JSON.stringify(options.marker ?? '')});
    if (first) fs.writeFileSync(${JSON.stringify(options.marker ?? '')}, '1');
    if (${options.alwaysCrash ? 'true' : 'false'}) { console.error('boom'); process.exit(3); }
    ${options.ignoreTerm ? "process.on('SIGTERM', () => console.log('ignoring SIGTERM'));" : ''}
    const crash = first && ${options.crashOnRequest ? 'true' : 'false'};
    require('http').createServer((q, s) => {
      if (crash && q.url === '/crash') { console.error('crashing'); process.exit(1); }
      s.end('ok');
    }).listen(${port}, '127.0.0.1', () => console.log('listening'));`;
  return { command: process.execPath, args: ['-e', script], url: `http://127.0.0.1:${port}` };
}

describe('Supervisor', () => {
  it('boots in sequence, forwards logs, restarts a crashed engine with backoff, stops cleanly', async () => {
    const dir = tempDir();
    const [p1, p2] = [await freePort(), await freePort()];
    const logs: string[] = [];
    const order: string[] = [];
    const sup = new Supervisor(
      [
        { name: 'a', ...fakeEngine(p1, { marker: join(dir, 'a-ran'), crashOnRequest: true }) },
        { name: 'b', ...fakeEngine(p2) },
      ],
      { restartDelayMs: 100, graceMs: 2000, log: (name, line) => logs.push(`[${name}] ${line}`) },
    );
    cleanup.push(() => sup.stop());
    let onRestart!: (name: string) => void;
    const restarted = new Promise<string>((resolve) => (onRestart = resolve));
    const events: Array<{ name: string; attempt: number }> = [];
    sup.on('restart', (e: { name: string; attempt: number }) => events.push(e));
    // both boot (healthy) in order; then 'a' crashes once, when asked (a 300 ms timer crashed a slow boot before it was healthy)
    await sup.start({ onReady: async (n) => void order.push(n), onRestart: async (n) => onRestart(n) });
    await fetch(`http://127.0.0.1:${p1}/crash`).catch(() => undefined); // the engine exits instead of answering
    expect(await restarted).toBe('a');
    expect(order).toEqual(['a', 'b']);
    expect(events).toEqual([expect.objectContaining({ name: 'a', attempt: 1, delayMs: 100 })]);
    // an engine's output lines arrive over a pipe, in no fixed order with its health answers
    await until(() => logs.includes('[a] crashing') && logs.includes('[b] listening') && logs.filter((l) => l === '[a] listening').length >= 2);
    expect(logs.filter((l) => l === '[a] listening')).toHaveLength(2);
    const pid = sup.pid('b')!;
    await sup.stop();
    expect(() => process.kill(pid, 0)).toThrow();
  });

  it('gives up on an engine that keeps crashing, and reports a boot that never becomes healthy', async () => {
    const port = await freePort();
    const sup = new Supervisor([{ name: 'bad', ...fakeEngine(port, { alwaysCrash: true }) }], { restartDelayMs: 50, maxRestarts: 2, log: () => undefined });
    cleanup.push(() => sup.stop());
    const gaveUp = new Promise((resolve) => sup.on('gaveUp', resolve));
    await expect(sup.start()).rejects.toMatchObject({ code: 'E_ENGINE_STATE', message: expect.stringMatching(/exited \(code 3\) before it was healthy/) });
    expect(await gaveUp).toMatchObject({ name: 'bad', restarts: 2 });
  });

  it('SIGKILLs an engine that ignores SIGTERM after the grace period', async () => {
    const dir = tempDir();
    const port = await freePort();
    const sup = new Supervisor([{ name: 'stubborn', ...fakeEngine(port, { ignoreTerm: true }) }], { graceMs: 300, log: () => undefined });
    await sup.start();
    const pid = sup.pid('stubborn')!;
    const exits: Array<{ signal: string | null }> = [];
    sup.on('exit', (e: { signal: string | null }) => exits.push(e));
    await sup.stop();
    expect(exits).toEqual([expect.objectContaining({ name: 'stubborn', signal: 'SIGKILL' })]);
    expect(() => process.kill(pid, 0)).toThrow();
    expect(existsSync(dir)).toBe(true);
  });
});

/** Whether a process runs (a zombie, killed but not yet reaped by init, does not). */
function alive(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]![0] !== 'Z';
  } catch {
    return false;
  }
}

async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 20)); // signals are delivered asynchronously; the test's timeout bounds this
}

describe('Supervisor: process groups', () => {
  it('engines run in their own process group: Ctrl-C to the terminal reaches only vsnap, which stops them with SIGTERM; states() follows them', async () => {
    const dir = tempDir();
    const port = await freePort();
    // an engine that says which signal it got, and a grandchild of its own (stopped with its group)
    const engine = `
      const { spawn } = require('child_process');
      const g = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
      console.log('grandchild ' + g.pid);
      for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => { console.log('engine got ' + s); process.exit(0); });
      require('http').createServer((q, r) => r.end('ok')).listen(${port}, '127.0.0.1', () => console.log('listening'));`;
    const host = join(dir, 'host.mts');
    writeFileSync(
      host,
      `import { Supervisor } from ${JSON.stringify(join(process.cwd(), 'src/serve/supervisor.ts'))};
      const sup = new Supervisor([{ name: 'e', command: process.execPath, args: ['-e', ${JSON.stringify(engine)}], url: 'http://127.0.0.1:${port}' }],
        { log: (n, l) => console.log('[' + n + '] ' + l), graceMs: 5000 });
      process.on('SIGINT', async () => { console.log('host got SIGINT'); console.log('states ' + JSON.stringify(sup.states().map((s) => s.status))); await sup.stop(); console.log('states ' + JSON.stringify(sup.states().map((s) => s.status))); process.exit(0); });
      console.log('states ' + JSON.stringify(sup.states().map((s) => s.status)));
      await sup.start();
      console.log('ready ' + sup.pid('e'));`,
    );
    // the host leads a process group, as a shell's foreground job does; Ctrl-C signals that whole group
    const child = spawn(process.execPath, ['--import', 'tsx', host], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    await new Promise<void>((resolve, reject) => {
      const t = setInterval(() => {
        if (/ready \d+/.test(out) && /grandchild \d+/.test(out)) resolve(clearInterval(t));
        if (child.exitCode !== null) reject(new Error(out));
      }, 20);
    });
    const enginePid = Number(/ready (\d+)/.exec(out)![1]);
    const grandchild = Number(/grandchild (\d+)/.exec(out)![1]);
    expect(readFileSync(`/proc/${enginePid}/stat`, 'utf8').split(') ')[1]!.split(' ')[2]).toBe(String(enginePid)); // its own group
    process.kill(-child.pid!, 'SIGINT');
    expect(await exited, out).toBe(0);
    expect(out).toContain('host got SIGINT');
    expect(out).toContain('engine got SIGTERM');
    expect(out).not.toContain('engine got SIGINT');
    expect(out).toMatch(/states \["stopped"\][\s\S]*states \["running"\][\s\S]*states \["stopped"\]/);
    await until(() => !alive(grandchild));
  });

  it('an engine is SIGKILLed with its group when the host exits without stopping it (a second Ctrl-C)', async () => {
    const dir = tempDir();
    const port = await freePort();
    const host = join(dir, 'host.mts');
    writeFileSync(
      host,
      `import { Supervisor } from ${JSON.stringify(join(process.cwd(), 'src/serve/supervisor.ts'))};
      const sup = new Supervisor([{ name: 'e', command: process.execPath, args: ['-e', "process.on('SIGTERM', () => {}); require('http').createServer((q, r) => r.end('ok')).listen(${port}, '127.0.0.1')"], url: 'http://127.0.0.1:${port}' }], { log: () => undefined });
      await sup.start();
      console.log('ready ' + sup.pid('e'));
      process.exit(130);`,
    );
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', host]).catch((e: { stdout: string }) => e);
    const pid = Number(/ready (\d+)/.exec(stdout)![1]);
    expect(pid).toBeGreaterThan(0);
    await until(() => !alive(pid));
  });
});

describe('Supervisor: engines die with the process that started them (SIGKILL included)', () => {
  /** Runs a host (a Supervisor in its own process) until its engine serves; returns the host and the engine's pid. */
  async function host(options: string): Promise<{ child: ReturnType<typeof spawn>; enginePid: number; out: () => string }> {
    const dir = tempDir();
    const port = await freePort();
    const file = join(dir, 'host.mts');
    writeFileSync(
      file,
      `import { Supervisor } from ${JSON.stringify(join(process.cwd(), 'src/serve/supervisor.ts'))};
      const sup = new Supervisor([{ name: 'e', command: process.execPath, args: ['-e', "require('http').createServer((q, r) => r.end('ok')).listen(${port}, '127.0.0.1')"], url: 'http://127.0.0.1:${port}' }], { log: () => undefined, ${options} });
      await sup.start();
      console.log('ready ' + sup.pid('e') + ' ' + sup.parentDeath);
      setInterval(() => {}, 1000);`,
    );
    const child = spawn(process.execPath, ['--import', 'tsx', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    await new Promise<void>((resolve, reject) => {
      const t = setInterval(() => {
        if (/ready \d+/.test(out)) resolve(clearInterval(t));
        if (child.exitCode !== null) reject(new Error(out));
      }, 20);
    });
    return { child, enginePid: Number(/ready (\d+)/.exec(out)![1]), out: () => out };
  }

  it('SIGKILL of the host: its engine gets the parent-death signal and exits (no leftover)', async () => {
    const { child, enginePid, out } = await host('');
    expect(out()).toMatch(/ready \d+ (setpriv|python3)/); // this machine has a way (Debian: util-linux's setpriv)
    expect(alive(enginePid)).toBe(true);
    child.kill('SIGKILL');
    await until(() => !alive(enginePid));
  });

  it('with parentDeathSignal: false the engine outlives a SIGKILL of its host (what the signal prevents)', async () => {
    const { child, enginePid, out } = await host('parentDeathSignal: false');
    expect(out()).toMatch(/ready \d+ off/);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    expect(alive(enginePid)).toBe(true);
    process.kill(-enginePid, 'SIGKILL');
    await until(() => !alive(enginePid));
  });

  it('the python3 wrapper (where setpriv is missing) sets the signal too, and refuses to run after its parent already died', async () => {
    const dir = tempDir();
    const file = join(dir, 'host.mts');
    writeFileSync(
      file,
      `import { spawn } from 'node:child_process';
      import { PYTHON_WRAPPER } from ${JSON.stringify(join(process.cwd(), 'src/serve/parent-death.ts'))};
      const c = spawn(PYTHON_WRAPPER.program, PYTHON_WRAPPER.args('SIGTERM', process.execPath, ['-e', 'console.log("engine " + process.pid); setInterval(() => {}, 1000)']), { stdio: ['ignore', 'inherit', 'inherit'], detached: true });
      setInterval(() => {}, 1000);`,
    );
    const child = spawn(process.execPath, ['--import', 'tsx', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    await until(() => /engine \d+/.test(out));
    const enginePid = Number(/engine (\d+)/.exec(out)![1]);
    child.kill('SIGKILL');
    await until(() => !alive(enginePid));
    // a wrapper whose parent is not the pid it was given (it died first) exits without running the command
    const orphan = await promisify(execFile)('python3', ['-c', (await import('../../src/serve/parent-death.js')).PYTHON_WRAPPER.args('SIGTERM', 'echo', ['ran'])[1]!, '15', '1', 'echo', 'ran']);
    expect(orphan.stdout).toBe('');
  });
});

describe('Supervisor: engine commands', () => {
  it('an engine command that does not exist is an E_CONFIG naming it and the model, before any engine starts (with or without the parent-death wrapper)', async () => {
    for (const parentDeathSignal of [false, 'SIGTERM'] as const) {
      const port = await freePort();
      const spawned: string[] = [];
      const sup = new Supervisor(
        [
          { name: 'first', ...fakeEngine(port) },
          { name: 'llama', command: 'vsnap-no-such-engine', args: ['serve'], url: 'http://127.0.0.1:9' },
        ],
        { parentDeathSignal, log: () => undefined },
      );
      cleanup.push(() => sup.stop());
      sup.on('spawn', (e: { name: string }) => spawned.push(e.name));
      const err = await sup.start().then(() => undefined, (e: unknown) => e as { code: string; message: string });
      expect(err?.code).toBe('E_CONFIG');
      expect(err?.message).toMatch(/engine 'llama': its command 'vsnap-no-such-engine' was not found: not found on PATH \(.*\)\. Set `command:` for llama in the configuration/);
      expect(err?.message).not.toMatch(/exited|code -2|127/);
      expect(spawned).toEqual([]); // said before the first engine was started
    }
    const relative = new Supervisor([{ name: 'm', command: './bin/nope', args: [], url: 'http://127.0.0.1:9' }], { log: () => undefined });
    await expect(relative.start()).rejects.toMatchObject({ code: 'E_CONFIG', message: expect.stringMatching(/its command '\.\/bin\/nope' was not found: no executable file at \/.*\/bin\/nope/) as string });
  });
});
