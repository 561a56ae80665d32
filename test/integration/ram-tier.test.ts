import { chmodSync, closeSync, openSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { allBytes, fillRegion, holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

async function setup(name: string, sizes: Record<string, number>, store?: RegionStore) {
  store ??= await RegionStore.open(tempDir());
  const regions = patternedRegions(sizes);
  for (const r of regions.values()) cleanup.push(r);
  const snap = await Snapshot.capture(store, name, { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize: MiB });
  const targets = () => {
    const t = patternedRegions(Object.fromEntries(Object.keys(sizes).map((k) => [k, sizes[k]!])));
    for (const r of t.values()) {
      cleanup.push(r);
      fillRegion(r, 0);
    }
    return t;
  };
  return { store, snap, targets };
}

const asTargets = (t: Map<string, HostRegion>) => [...t].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));

describe('RamTier (RAM tier)', () => {
  it('loads a snapshot once, verified, then restores from RAM without touching the store', async () => {
    const { store, snap, targets } = await setup('m', { a: 3 * MiB + 5, b: MiB });
    const cache = await RamTier.create({ budgetBytes: 16 * MiB, pin: false });
    cleanup.push(cache);
    expect(cache.pinned).toBe(false);

    const first = targets();
    const r1 = await snap.restore({ regions: asTargets(first), ram: cache });
    expect(r1.tier).toBe('store');
    expect(cache.has(snap.id)).toBe(true);
    expect(cache.entries).toEqual([expect.objectContaining({ name: 'm', id: snap.id })]);
    for (const [k, r] of first) expect(holdsPattern(r, k)).toBe(true);

    // The RAM tier serves the next restore even with the blobs gone from the store.
    await store.remove('m');
    await store.gc();
    const second = targets();
    const r2 = await snap.restore({ regions: asTargets(second), ram: cache });
    expect(r2.tier).toBe('ram');
    for (const [k, r] of second) expect(holdsPattern(r, k)).toBe(true);
  });

  it('evicts the least recently used snapshot to make room', async () => {
    const store = await RegionStore.open(tempDir());
    const one = await setup('one', { x: 6 * MiB }, store);
    const two = await setup('two', { y: 6 * MiB }, store);
    const three = await setup('three', { z: 6 * MiB }, store);
    const cache = await RamTier.create({ budgetBytes: 13 * MiB, pin: false });
    cleanup.push(cache);
    await cache.load(store, one.snap.manifest);
    await cache.load(store, two.snap.manifest);
    await one.snap.restore({ regions: asTargets(one.targets()), ram: cache }); // one is now the most recent
    await cache.load(store, three.snap.manifest);
    expect(cache.has(one.snap.id)).toBe(true);
    expect(cache.has(two.snap.id)).toBe(false);
    expect(cache.has(three.snap.id)).toBe(true);
    expect(cache.usedBytes).toBe(12 * MiB);
  });

  it('refuses a corrupt blob at load: nothing cached, nothing written to the target', async () => {
    const { store, snap, targets } = await setup('c', { a: 4 * MiB });
    const blob = store.blobPath(snap.manifest.data.ranks[0]!.regions[0]!.blob);
    chmodSync(blob, 0o644);
    const fd = openSync(blob, 'r+');
    writeSync(fd, Buffer.from('x'), 0, 1, 3 * MiB);
    closeSync(fd);
    const cache = await RamTier.create({ budgetBytes: 8 * MiB, pin: false });
    cleanup.push(cache);
    const t = targets();
    await expect(snap.restore({ regions: asTargets(t), ram: cache })).rejects.toMatchObject({ code: 'E_CHECKSUM' });
    expect(cache.has(snap.id)).toBe(false);
    expect(cache.usedBytes).toBe(0);
    for (const r of t.values()) expect(allBytes(r, 0)).toBe(true);
  });

  it('streams from the store when a snapshot is larger than the cache', async () => {
    const { snap, targets } = await setup('big', { a: 5 * MiB });
    const cache = await RamTier.create({ budgetBytes: 4 * MiB, pin: false });
    cleanup.push(cache);
    const t = targets();
    const result = await snap.restore({ regions: asTargets(t), ram: cache });
    expect(result.tier).toBe('store');
    expect(cache.has(snap.id)).toBe(false);
    expect(holdsPattern(t.get('a')!, 'a')).toBe(true);
    await expect(cache.load(snap.store, snap.manifest)).rejects.toMatchObject({ code: 'E_NO_SPACE' });
  });

  it('rejects a bad budget and use after close', async () => {
    await expect(RamTier.create({ budgetBytes: 0 })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    const { store, snap } = await setup('z', { a: MiB });
    const cache = await RamTier.create({ budgetBytes: 2 * MiB, pin: false });
    cache.close();
    await expect(cache.load(store, snap.manifest)).rejects.toMatchObject({ code: 'E_CLOSED' });
  });
});
