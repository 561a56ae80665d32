import { afterEach, describe, expect, it } from 'vitest';

import { NeighbourTier } from '../../src/cache/neighbour-tier.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { hostPeerBackend } from '../helpers/neighbour.js';
import { fillRegion, holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

// NeighbourTier's LRU order, footprint, makeRoom, and evictions or close() while a restore or a
// park runs, on the host peer backend (test/helpers/neighbour.ts).

const KiB = 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

async function engine() {
  const regions = patternedRegions({ 'w.0': 100 * KiB, 'w.1': 64 * KiB });
  for (const r of regions.values()) cleanup.push(r);
  const live = [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
  const snap = await Snapshot.capture(await RegionStore.open(tempDir()), 'e', { regions: live, chunkSize: 64 * KiB });
  return { regions, live, manifest: snap.manifest, intact: () => [...regions].every(([k, r]) => holdsPattern(r, k)) };
}

describe('NeighbourTier: LRU, footprint, and evictions while it copies (host peer backend)', () => {
  it('footprint rounds each region to the granularity; entries are least recently used first; makeRoom evicts the oldest', async () => {
    const e = await engine();
    const peer = hostPeerBackend({ granularity: 64 * KiB });
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 3 * 192 * KiB, backend: peer.backend });
    cleanup.push(tier);
    expect(await tier.footprint(e.live)).toBe(192 * KiB); // 128 + 64
    await tier.park('a', e.live);
    await tier.park('b', e.live);
    await tier.park('c', e.live);
    expect(tier.entries().map((x) => x.id)).toEqual(['a', 'b', 'c']);
    await tier.restore('a', e.live); // a restore is a use
    expect(tier.entries().map((x) => x.id)).toEqual(['b', 'c', 'a']);
    await expect(tier.park('d', e.live)).rejects.toMatchObject({ code: 'E_NO_SPACE' });
    await tier.park('d', e.live, { makeRoom: true });
    expect(tier.entries()).toEqual([{ id: 'c', bytes: 192 * KiB }, { id: 'a', bytes: 192 * KiB }, { id: 'd', bytes: 192 * KiB }]);
    expect(peer.openCount()).toBe(6);
    // more than the whole budget: refused, and nothing evicted for it
    await expect(tier.park('huge', [...e.live, ...e.live.map((r) => ({ ...r, key: `${r.key}'` })), ...e.live.map((r) => ({ ...r, key: `${r.key}"` })), ...e.live.map((r) => ({ ...r, key: `${r.key}*` }))], { makeRoom: true })).rejects.toMatchObject({ code: 'E_NO_SPACE' });
    expect(tier.entries().map((x) => x.id)).toEqual(['c', 'a', 'd']);
  });

  it('evicted while its copy runs: the restore fails with E_SNAPSHOT_NOT_FOUND (details.evicted); memory freed when the copy ends', async () => {
    const e = await engine();
    const peer = hostPeerBackend();
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 1 << 20, backend: peer.backend });
    cleanup.push(tier);
    await tier.park('a', e.live);
    for (const r of e.regions.values()) fillRegion(r, 0);
    let during = -1;
    peer.hooks.beforeRestoreCopy = () => {
      tier.evict('a');
      during = peer.openCount();
    };
    await expect(tier.restore('a', e.live, { manifest: e.manifest })).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND', details: { id: 'a', evicted: true } });
    expect(during).toBe(2); // held by the running copy
    expect(peer.openCount()).toBe(0);
    expect(tier.usedBytes).toBe(0);
    // a copy that fails after the eviction reports the eviction too
    await tier.park('b', e.live);
    peer.hooks.beforeRestoreCopy = () => void tier.evict('b');
    peer.hooks.failRestoreCopy = true;
    await expect(tier.restore('b', e.live)).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND', details: { evicted: true } });
    // without an eviction, the restore is what it was
    peer.hooks.beforeRestoreCopy = undefined;
    peer.hooks.failRestoreCopy = false;
    await tier.park('c', e.live);
    await tier.restore('c', e.live, { manifest: e.manifest });
    expect(e.intact()).toBe(true);
  });

  it('closed while a park copies: the park fails (E_CLOSED) and frees what it allocated', async () => {
    const e = await engine();
    const peer = hostPeerBackend();
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 1 << 20, backend: peer.backend });
    const copy = peer.backend.copy;
    peer.backend.copy = async (device, pairs) => {
      tier.close();
      return copy(device, pairs);
    };
    await expect(tier.park('a', e.live)).rejects.toMatchObject({ code: 'E_CLOSED' });
    expect(peer.openCount()).toBe(0);
    expect(tier.usedBytes).toBe(0);
    expect(tier.has('a')).toBe(false);
  });
});
