import { afterEach, describe, expect, it } from 'vitest';

import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { RAM_TIER_SIZES, ramTierFixtures } from '../helpers/ram-tier.js';
import { tempDir } from '../helpers/tmp.js';

// Capture into the RAM tier first, with the three persistence policies (host-memory backend,
// real store on disk, real native transfer engine).
const MiB = 1024 * 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

const SIZES = RAM_TIER_SIZES;
const { sources, targets, asTargets, intact, cacheOf } = ramTierFixtures(cleanup);

describe('capture into the RAM tier', () => {
  it("persist 'off': lives in RAM only, restores from there, is never evicted for room, and persist() makes it durable", async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    expect(snap.durable).toBe(false);
    expect(await store.current('m')).toBeUndefined();
    expect(cache.entries).toEqual([expect.objectContaining({ id: snap.id, durable: false })]);

    const t = targets();
    expect((await snap.restore({ regions: asTargets(t), ram: cache })).tier).toBe('ram');
    expect(intact(t)).toBe(true);
    await expect(snap.restore({ regions: asTargets(targets()) })).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
    await expect(snap.verify()).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });

    // A durable snapshot that needs the room cannot push out the only copy of this one.
    const other = await Snapshot.capture(store, 'other', { regions: sources({ x: 5 * MiB }), chunkSize: MiB });
    await expect(cache.load(store, other.manifest)).rejects.toMatchObject({ code: 'E_NO_SPACE' });
    cache.clear();
    expect(cache.has(snap.id)).toBe(true);

    await snap.persist();
    expect(snap.durable).toBe(true);
    const opened = await Snapshot.open(store, 'm');
    expect(opened.manifest.data).toEqual(snap.manifest.data);
    expect((await opened.verify()).problems).toEqual([]);
    expect(cache.entries.find((e) => e.id === snap.id)?.durable).toBe(true);
    const fromStore = targets();
    expect((await opened.restore({ regions: asTargets(fromStore) })).tier).toBe('store');
    expect(intact(fromStore)).toBe(true);
    // now durable, it makes room like any other
    await cache.load(store, other.manifest);
    expect(cache.has(snap.id)).toBe(false);
  });

  it("persist 'async': resolves once in RAM, then becomes durable in the background with the same blobs as a sync capture", async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const regions = sources();
    const snap = await Snapshot.capture(store, 'm', { regions, chunkSize: MiB, ram: cache, persist: 'async' });
    expect(snap.durable).toBe(false);
    await snap.persist();
    expect(snap.durable).toBe(true);
    expect((await store.current('m'))?.id).toBe(snap.id);
    const sync = await Snapshot.capture(store, 'm2', { regions, chunkSize: MiB });
    expect(sync.manifest.data.ranks[0]!.regions.map((r) => r.blob)).toEqual(snap.manifest.data.ranks[0]!.regions.map((r) => r.blob));
    expect(sync.lastCapture!.dedupedBytes).toBe(snap.manifest.totalBytes);
  });

  it("persist 'sync' with a cache: durable and in RAM from one pass; too large for the cache, store only", async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache });
    expect(snap.durable).toBe(true);
    expect(cache.entries).toEqual([expect.objectContaining({ id: snap.id, durable: true })]);
    const t = targets();
    expect((await snap.restore({ regions: asTargets(t), ram: cache })).tier).toBe('ram');
    expect(intact(t)).toBe(true);

    const big = await Snapshot.capture(store, 'big', { regions: sources({ x: 9 * MiB }), chunkSize: MiB, ram: cache });
    expect(big.durable).toBe(true);
    expect(cache.has(big.id)).toBe(false);
    await expect(Snapshot.capture(store, 'big2', { regions: sources({ x: 9 * MiB }), chunkSize: MiB, ram: cache, persist: 'off' })).rejects.toMatchObject({
      code: 'E_NO_SPACE',
    });
    expect(cache.entries.map((e) => e.id)).toEqual([snap.id]);
  });

  it('an evicted RAM-only capture is gone: restore and persist say so', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    expect(cache.evict(snap.id)).toBe(true);
    await expect(snap.restore({ regions: asTargets(targets()), ram: cache })).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
    await expect(snap.persist()).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
    expect(await store.current('m')).toBeUndefined();
  });

  it('refuses a persistence policy it cannot honour', async () => {
    const store = await RegionStore.open(tempDir());
    await expect(Snapshot.capture(store, 'm', { regions: sources(), persist: 'async' })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    const cache = await cacheOf(8 * MiB);
    // @ts-expect-error: not a policy
    await expect(Snapshot.capture(store, 'm', { regions: sources(), ram: cache, persist: 'later' })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    expect(cache.usedBytes).toBe(0);
  });

  it('refuses an option it does not have (the RAM tier is passed as ram), before it copies a byte', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const refused = { code: 'E_INVALID_ARGUMENT', details: { key: 'cache' } };
    await expect(Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, cache } as never)).rejects.toMatchObject(refused);
    expect(cache.usedBytes).toBe(0);
    expect(await store.current('m')).toBeUndefined();
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB });
    const t = targets();
    await expect(snap.restore({ regions: asTargets(t), cache } as never)).rejects.toMatchObject(refused);
    expect(intact(t)).toBe(false); // nothing was copied
    expect(cache.usedBytes).toBe(0);
    expect((await snap.restore({ regions: asTargets(t), ram: cache })).tier).toBe('store'); // loaded into the RAM tier on the way
    expect(intact(t)).toBe(true);
    expect(cache.has(snap.id)).toBe(true);
  });

  it('a capture persisted late does not replace a newer one as current', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const older = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    const newer = await Snapshot.capture(store, 'm', { regions: sources({ a: MiB }), chunkSize: MiB });
    await older.persist();
    expect((await store.current('m'))?.id).toBe(newer.id);
    expect((await Snapshot.open(store, 'm', { id: older.id })).manifest.data).toEqual(older.manifest.data);
  });
});
