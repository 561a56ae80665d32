import { readSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { NeighbourTier, type NeighbourBackend } from '../../src/cache/neighbour-tier.js';
import { HostRegion } from '../../src/regions/host-region.js';
import type { RegionMemory } from '../../src/regions/memory.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { fillRegion, holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

// The neighbour tier's bookkeeping (budget, rollback, verification, evict, close) on host memory:
// "GPUs" are memfds tagged with a device number, the peer copy a host copy. The digests and the
// manifest checks are the real ones (on the CPU for host memory); test/gpu/neighbour.gpu.test.ts
// runs the same class on two GPUs.

const KiB = 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

function hostBackend(devices: Map<number, number>, faults: { failCopyAt?: number } = {}) {
  const open = new Map<number, HostRegion>();
  const copiesOn: number[] = [];
  let copies = 0;
  const fdOf = (m: RegionMemory): number => (m.kind === 'host' ? m.fd : -1);
  const backend: NeighbourBackend = {
    deviceOf: (m) => devices.get(fdOf(m)),
    granularity: async () => 64 * KiB,
    async allocate(device, size) {
      const r = HostRegion.create(size, 'parked');
      devices.set(r.fd, device);
      open.set(r.fd, r);
      return { memory: r.memory, close: () => (open.delete(r.fd), r.close()) };
    },
    async copy(device, pairs) {
      copiesOn.push(device);
      for (const p of pairs) {
        if (++copies === faults.failCopyAt) throw new VsnapError('E_CUDA', 'injected fault: the peer copy failed');
        const buf = Buffer.alloc(p.size);
        readSync(fdOf(p.src), buf, 0, p.size, 0);
        writeSync(fdOf(p.dst), buf, 0, p.size, 0);
      }
      return { bytes: pairs.reduce((s, p) => s + p.size, 0), seconds: 0.001 };
    },
  };
  return { backend, open, copiesOn };
}

/** An "engine" on device 0 with three regions, and its snapshot (with GPU digests). */
async function engine() {
  const sizes = { 'w.0': 300 * KiB + 5, 'w.1': 64 * KiB, 'w.2': 1024 * KiB };
  const regions = patternedRegions(sizes);
  for (const r of regions.values()) cleanup.push(r);
  const devices = new Map<number, number>([...regions.values()].map((r) => [r.fd, 0]));
  const live = [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
  const snap = await Snapshot.capture(await RegionStore.open(tempDir()), 'e', { regions: live, chunkSize: 64 * KiB });
  return { regions, devices, live, manifest: snap.manifest, intact: () => [...regions].every(([k, r]) => holdsPattern(r, k)) };
}

const rounded = (n: number) => Math.ceil(n / (64 * KiB)) * 64 * KiB;

describe('NeighbourTier (host-memory backend)', () => {
  it('parks on the neighbour, restores by a copy on the engine\'s GPU, and verifies against the manifest', async () => {
    const e = await engine();
    const { backend, open, copiesOn } = hostBackend(e.devices);
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 4096 * KiB, backend });
    cleanup.push(tier);
    await tier.park('snap-1', e.live, { manifest: e.manifest });
    expect(tier.usedBytes).toBe(e.live.reduce((s, r) => s + rounded(r.size), 0));
    expect(open.size).toBe(3);
    for (const r of e.regions.values()) fillRegion(r, 0); // the engine slept: its weights are gone
    const r = await tier.restore('snap-1', [...e.live].reverse(), { manifest: e.manifest });
    expect(r.bytes).toBe(e.live.reduce((s, x) => s + x.size, 0));
    expect(r.digestSeconds).toBeDefined();
    expect(e.intact()).toBe(true);
    expect(copiesOn).toEqual([0, 0]); // both copies on the engine's GPU, which reaches the neighbour
    expect(tier.ids()).toEqual(['snap-1']);
  });

  it('refuses what does not fit its budget, allocating nothing', async () => {
    const e = await engine();
    const { backend, open } = hostBackend(e.devices);
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 1024 * KiB, backend });
    cleanup.push(tier);
    await expect(tier.park('x', e.live)).rejects.toMatchObject({ code: 'E_NO_SPACE' });
    expect(open.size).toBe(0);
    expect(tier.usedBytes).toBe(0);
  });

  it('a copy failing during a park frees everything allocated for it', async () => {
    const e = await engine();
    const { backend, open } = hostBackend(e.devices, { failCopyAt: 2 });
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 4096 * KiB, backend });
    cleanup.push(tier);
    await expect(tier.park('x', e.live)).rejects.toMatchObject({ code: 'E_CUDA' });
    expect(open.size).toBe(0);
    expect(tier.usedBytes).toBe(0);
    expect(tier.has('x')).toBe(false);
  });

  it('weights that differ from the snapshot are not parked (E_DIGEST_MISMATCH), and nothing is kept', async () => {
    const e = await engine();
    e.regions.get('w.2')!.write(100, Buffer.from('changed'));
    const { backend, open } = hostBackend(e.devices);
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 4096 * KiB, backend });
    cleanup.push(tier);
    await expect(tier.park('x', e.live, { manifest: e.manifest })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH' });
    expect(open.size).toBe(0);
    expect(tier.usedBytes).toBe(0);
  });

  it('a parked copy damaged in the neighbour\'s memory is caught by the restore\'s digest check', async () => {
    const e = await engine();
    const { backend, open } = hostBackend(e.devices);
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 4096 * KiB, backend });
    cleanup.push(tier);
    await tier.park('x', e.live);
    const parked = [...open.values()].find((r) => r.size === 64 * KiB)!; // w.1's copy
    parked.write(10, Buffer.from([0xff, 0xfe]));
    await expect(tier.restore('x', e.live, { manifest: e.manifest })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH' });
  });

  it('restore refuses regions that do not match what is parked; evict and close free everything', async () => {
    const e = await engine();
    const { backend, open } = hostBackend(e.devices);
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 8192 * KiB, backend });
    await tier.park('a', e.live);
    await tier.park('b', e.live.slice(0, 1));
    await expect(tier.park('b', e.live.slice(0, 1))).rejects.toMatchObject({ code: 'E_BUSY' });
    await expect(tier.restore('a', e.live.slice(1))).rejects.toMatchObject({ code: 'E_MANIFEST_MISMATCH' });
    await expect(tier.restore('a', [{ ...e.live[0]!, size: 7 }, ...e.live.slice(1)])).rejects.toMatchObject({ code: 'E_MANIFEST_MISMATCH' });
    await expect(tier.restore('nope', e.live)).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    expect(tier.evict('b')).toBe(true);
    expect(tier.evict('b')).toBe(false);
    expect(open.size).toBe(3);
    tier.close();
    expect(open.size).toBe(0);
    expect(tier.usedBytes).toBe(0);
    await expect(tier.park('c', e.live)).rejects.toMatchObject({ code: 'E_CLOSED' });
  });

  it('checks its options and where the memory is', async () => {
    expect(() => NeighbourTier.create({ device: -1, budgetBytes: 1 })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
    expect(() => NeighbourTier.create({ device: 1, budgetBytes: 0 })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
    const e = await engine();
    const tier = NeighbourTier.create({ device: 0, budgetBytes: 1 << 30, backend: hostBackend(e.devices).backend });
    cleanup.push(tier);
    await expect(tier.park('m', e.live)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/other than the tier's/) });
    // the default (CUDA) backend: host memory has no GPU
    const cuda = NeighbourTier.create({ device: 1, budgetBytes: 1 << 30 });
    cleanup.push(cuda);
    await expect(cuda.park('m', e.live)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});
