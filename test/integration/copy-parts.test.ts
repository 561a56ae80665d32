import { afterEach, describe, expect, it } from 'vitest';

import { native } from '../../src/native/index.js';
import { pushParts } from '../../src/snapshot/copy-overlap.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { openFds } from '../helpers/faults.js';
import { ramTierFixtures } from '../helpers/ram-tier.js';
import { tempDir } from '../helpers/tmp.js';

// A RAM-tier restore queues each stage of its copy in parts (16 regions, then up to 16 times the
// part before: src/snapshot/copy-overlap.ts), so the copy starts once the first few regions are
// queued instead of once thousands are. Host-memory backend, real copy queue.
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  native().setFault('copy-fail', 0);
  for (const c of cleanup.splice(0)) c.close();
});
const { sources, targets, asTargets, intact, cacheOf } = ramTierFixtures(cleanup);

/** 300 regions of distinct sizes and contents (one empty): a stage of them spans three parts. */
const SIZES: Record<string, number> = Object.fromEntries(Array.from({ length: 300 }, (_, i) => [`layer.${i}`, i === 7 ? 0 : 4096 + 13 * i]));

describe('a stage of the copy queued in parts', () => {
  it('parts of 16, then up to 16 times the part before, covering every region once', () => {
    expect(pushParts(0)).toEqual([0]);
    expect(pushParts(1)).toEqual([1]);
    expect(pushParts(16)).toEqual([16]);
    expect(pushParts(17)).toEqual([16, 1]);
    expect(pushParts(300)).toEqual([16, 256, 28]);
    expect(pushParts(5000)).toEqual([16, 256, 4096, 632]);
    for (const n of [2, 271, 272, 273, 4368, 4369, 70000]) expect(pushParts(n).reduce((a, b) => a + b, 0)).toBe(n);
  });

  it('300 regions restored from the RAM tier land intact, each once', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * 1024 * 1024);
    const snap = await Snapshot.capture(store, 'parts', { regions: sources(SIZES), ram: cache, persist: 'off' });
    const t = targets(SIZES);
    const report = await snap.restore({ regions: asTargets(t), ram: cache });
    expect(report.tier).toBe('ram');
    expect(report.bytes).toBe(Object.values(SIZES).reduce((a, b) => a + b, 0));
    expect(intact(t)).toBe(true);
  });

  it('a copy failing inside the second part fails the restore, lets go of the RAM tier, and the next restore is intact', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * 1024 * 1024);
    const snap = await Snapshot.capture(store, 'parts', { regions: sources(SIZES), ram: cache, persist: 'off' });
    const failing = asTargets(targets(SIZES));
    const fds = openFds();
    native().setFault('copy-fail', 1, 40); // 40 copies land (the first part's 15 non-empty regions and 25 of the second), the 41st fails
    await expect(snap.restore({ regions: failing, ram: cache })).rejects.toMatchObject({ code: 'E_CUDA', message: expect.stringMatching(/injected fault/) });
    expect(openFds()).toEqual(fds);
    native().setFault('copy-fail', 0);
    const t = targets(SIZES);
    expect((await snap.restore({ regions: asTargets(t), ram: cache })).tier).toBe('ram');
    expect(intact(t)).toBe(true);
    expect(cache.evict(snap.id)).toBe(true); // nothing still leases it: the failed restore let go of its lease
  });
});
