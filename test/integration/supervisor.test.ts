import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { Supervisor } from '../../src/swap/supervisor.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0)) await c();
});

/** A tiny engine: serves /health; crashes after `crashAfterMs` on its first run (marker file). */
function fakeEngine(port: number, options: { marker?: string; crashAfterMs?: number; alwaysCrash?: boolean; ignoreTerm?: boolean } = {}) {
  const script = `
    const fs = require('fs');
    const first = ${JSON.stringify(options.marker ?? '')} && !fs.existsSync(${JSON.stringify(options.marker ?? '')});
    if (first) fs.writeFileSync(${JSON.stringify(options.marker ?? '')}, '1');
    if (${options.alwaysCrash ? 'true' : 'false'}) { console.error('boom'); process.exit(3); }
    ${options.ignoreTerm ? "process.on('SIGTERM', () => console.log('ignoring SIGTERM'));" : ''}
    require('http').createServer((q, s) => s.end('ok')).listen(${port}, '127.0.0.1', () => console.log('listening'));
    if (first && ${options.crashAfterMs ?? 0}) setTimeout(() => { console.error('crashing'); process.exit(1); }, ${options.crashAfterMs ?? 0});`;
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
        { name: 'a', ...fakeEngine(p1, { marker: join(dir, 'a-ran'), crashAfterMs: 300 }) },
        { name: 'b', ...fakeEngine(p2) },
      ],
      { restartDelayMs: 100, graceMs: 2000, log: (name, line) => logs.push(`[${name}] ${line}`) },
    );
    cleanup.push(() => sup.stop());
    const restarted = new Promise<string>((resolve) => sup.start({ onReady: async (n) => void order.push(n), onRestart: async (n) => resolve(n) }).catch(() => undefined));
    const events: Array<{ name: string; attempt: number }> = [];
    sup.on('restart', (e: { name: string; attempt: number }) => events.push(e));
    expect(await restarted).toBe('a');
    expect(order).toEqual(['a', 'b']);
    expect(events).toEqual([expect.objectContaining({ name: 'a', attempt: 1, delayMs: 100 })]);
    expect(logs).toContain('[a] crashing');
    expect(logs.filter((l) => l === '[a] listening')).toHaveLength(2);
    expect(logs).toContain('[b] listening');
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
