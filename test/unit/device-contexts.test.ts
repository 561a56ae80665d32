import { afterEach, describe, expect, it, vi } from 'vitest';

import { digestRegions } from '../../src/digest/index.js';
import { DeviceContexts, deviceContexts } from '../../src/transfer/contexts.js';
import { runTransfer } from '../../src/transfer/transfer.js';

// The CUDA contexts of the GPUs a transfer or digest touches are kept between operations: a TP=2
// restore made and destroyed GPU 1's context for the hydrate and again for the digest check (GPU
// 0's stayed, held by the pinned RAM tier), which cost more than moving its bytes. The GPU suite
// (test/gpu/tp.gpu.test.ts) measures it; here, the bookkeeping and the wiring.

function recorder(fail: Set<number> = new Set()) {
  const log: string[] = [];
  return {
    log,
    ops: {
      keep: async (d: number) => {
        log.push(`keep ${d}`);
        if (fail.has(d)) throw new Error(`no device ${d}`);
      },
      release: async (d: number) => {
        log.push(`release ${d}`);
      },
    },
  };
}

afterEach(() => {
  vi.restoreAllMocks();
  vi.useRealTimers();
});

describe('DeviceContexts', () => {
  it('keeps each device once across operations, concurrent ones included, and lets go when idle', async () => {
    vi.useFakeTimers();
    const { log, ops } = recorder();
    const contexts = new DeviceContexts(ops, 1000);
    const seen: number[][] = [];
    await contexts.use([1, 0, undefined, 1], async () => seen.push(contexts.kept()));
    await Promise.all([contexts.use([0, 1], async () => seen.push(contexts.kept())), contexts.use([1], async () => seen.push(contexts.kept()))]);
    expect(seen).toEqual([[0, 1], [0, 1], [0, 1]]);
    expect(log).toEqual(['keep 0', 'keep 1']); // not made again for the second and third operation
    await vi.advanceTimersByTimeAsync(999);
    expect(contexts.kept()).toEqual([0, 1]);
    await vi.advanceTimersByTimeAsync(1);
    expect(contexts.kept()).toEqual([]);
    expect(log).toEqual(['keep 0', 'keep 1', 'release 0', 'release 1']);
  });

  it('releaseIdle lets go of idle devices at once, never of one in use', async () => {
    const { log, ops } = recorder();
    const contexts = new DeviceContexts(ops, 60_000);
    await contexts.use([0], async () => undefined);
    let inUse!: () => void;
    const running = contexts.use([1], () => new Promise<void>((resolve) => (inUse = resolve)));
    await vi.waitFor(() => expect(inUse).toBeTypeOf('function'));
    await contexts.releaseIdle();
    expect(contexts.kept()).toEqual([1]);
    expect(log).toEqual(['keep 0', 'keep 1', 'release 0']);
    inUse();
    await running;
    await contexts.releaseIdle();
    expect(contexts.kept()).toEqual([]);
    expect(log.at(-1)).toBe('release 1');
  });

  it('a device whose context cannot be made does not fail the operation, is not released, and is tried again next time', async () => {
    const { log, ops } = recorder(new Set([1]));
    const contexts = new DeviceContexts(ops, 60_000);
    await expect(contexts.use([0, 1], async () => 'ran')).resolves.toBe('ran');
    expect(contexts.kept()).toEqual([0]);
    await contexts.use([1], async () => undefined);
    expect(log).toEqual(['keep 0', 'keep 1', 'keep 1']);
    await contexts.releaseIdle();
    expect(log.at(-1)).toBe('release 0');
    expect(log.filter((l) => l === 'release 1')).toEqual([]);
  });

  it('an operation that throws still lets go of its use', async () => {
    const { log, ops } = recorder();
    const contexts = new DeviceContexts(ops, 60_000);
    await expect(contexts.use([2], async () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    await contexts.releaseIdle();
    expect(log).toEqual(['keep 2', 'release 2']);
  });
});

describe('transfers and digests keep the contexts of every GPU they touch', () => {
  const imported = (fd: number, device: number) => ({ kind: 'imported' as const, fd, device });

  it('a restore into regions of two GPUs keeps both devices for the transfer', async () => {
    const asked: Array<Array<number | undefined>> = [];
    vi.spyOn(deviceContexts, 'use').mockImplementation(async (devices) => {
      asked.push([...devices]);
      throw new Error('stop here');
    });
    const regions = [0, 1, 0, 1].map((device, i) => ({ name: `r${i}`, size: 4096, chunkSize: 4096, memory: imported(100 + i, device) }));
    await expect(runTransfer({ op: 'hydrate', label: 'tp', regions })).rejects.toThrow('stop here');
    expect(asked).toEqual([[0, 1, 0, 1]]);
  });

  it('a digest of regions on two GPUs keeps both devices', async () => {
    const asked: Array<Array<number | undefined>> = [];
    vi.spyOn(deviceContexts, 'use').mockImplementation(async (devices) => {
      asked.push([...devices]);
      throw new Error('stop here');
    });
    await expect(digestRegions([{ size: 4096, chunkSize: 4096, memory: imported(7, 1) }, { size: 4096, chunkSize: 4096, memory: imported(8, 0) }])).rejects.toThrow('stop here');
    expect(asked).toEqual([[1, 0]]);
  });
});
