// The CPU parts of the two-GPU capture row of `npm run bench -- swap` (bench/capture-two-gpu.ts):
// both capture modes on host memory, the hashing-load profiler, and the tables. No timing is
// asserted: only that every part runs and reports what it measured.
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, describe, expect, it } from 'vitest';

import { capture2Table, capture2Target, runCapture2, withHashLoad } from '../../bench/capture-two-gpu.js';
import { RegionStore } from '../../src/index.js';
import { packageRoot } from '../../src/native/index.js';

const MiB = 1024 * 1024;
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'vsnap-bench-capture2-'));
  dirs.push(d);
  return d;
};
const addon = (): string => {
  const dir = join(packageRoot(), 'prebuilds', 'linux-x64');
  return process.env.VSNAP_NATIVE_PATH ?? join(dir, readdirSync(dir).find((f) => f.endsWith('.node'))!);
};

describe('bench swap: two-GPU capture row', () => {
  it('is skipped with a reason on fewer than two GPUs', async () => {
    const store = await RegionStore.open(tmp());
    const r = await runCapture2({ gpus: 1, totalBytes: 16 * 1024 * MiB, reps: 1, ceilingBin: null, hashThreads: 1, nativePath: addon(), store, log: () => {} });
    expect(r.skipped).toMatch(/needs 2 GPUs, 1 visible/);
    expect(capture2Table(r)).toContain('skipped: needs 2 GPUs');
    expect(capture2Target(r).met).toBeNull();
  });

  it('on host memory, measures both modes, persists the deferred capture and leaves nothing in the store', async () => {
    const root = tmp();
    const store = await RegionStore.open(root);
    const logged: string[] = [];
    const r = await runCapture2({ device: 'host', gpus: 0, totalBytes: 64 * MiB, reps: 1, ceilingBin: null, hashThreads: 1, nativePath: addon(), store, log: (m) => logged.push(m) });
    expect(r.skipped).toBeNull();
    expect(r.hashed).toMatchObject({ hash: 'now', vsD2h: null, byThreads: [] });
    expect(r.deferred).toMatchObject({ hash: 'deferred', vsD2h: null });
    expect(r.deferred!.GBps).toBeGreaterThan(0);
    expect(r.deferredPersistSeconds).toBeGreaterThan(0);
    expect(r.oneGpu!.deferredGBps).toBeGreaterThan(0);
    expect(logged.some((m) => m.includes('deferred hash'))).toBe(true);
    expect([...(await store.list())]).toEqual([]);
    expect((await store.usage()).blobs).toBe(0);
    const table = capture2Table(r);
    expect(table).toContain('(hashed), best of 1');
    expect(table).toContain('(deferred hash), best of 1');
    expect(table).toContain('persisting the deferred capture');
    expect(capture2Target(r).met).toBeNull(); // no D2H ceiling on the host
    expect(capture2Target(r).value).toContain('deferred hash (hashed: n/a)');
  });

  it('hashes on every thread while the measured work runs, with per-pass timestamps', async () => {
    const { value, load } = await withHashLoad(addon(), 2, () => new Promise<string>((r) => setTimeout(() => r('done'), 200)), 4 * MiB);
    expect(value).toBe('done');
    expect(load.threads).toBe(2);
    expect(load.passes).toHaveLength(2);
    for (const passes of load.passes) {
      expect(passes.length).toBeGreaterThan(0);
      for (const [start, end, bytes] of passes) {
        expect(end).toBeGreaterThanOrEqual(start);
        expect(bytes).toBe(4 * MiB);
      }
    }
    expect(load.GBps).toBeGreaterThan(0);
  });

  it('stops the hashing threads when the measured work fails', async () => {
    await expect(withHashLoad(addon(), 1, () => Promise.reject(new Error('boom')), MiB)).rejects.toThrow('boom');
  });
});
