import { randomFillSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { native, type NativeMapFault, type NativeVmmTimings } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { MappedRegions } from '../../src/regions/mapped.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';
import { vmmSince as since } from '../helpers/vmm.js';

// Issue 14, per-region cost: the batched form of a region set (one reservation, each region
// mapped at its offset, one access call per contiguous run; native/transfer/region_batch.h) on
// the host backend, which runs the same steps and failure paths as the CUDA one. The GPU side is
// test/gpu/mapped.gpu.test.ts.

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  native().setFault('map-import', 0);
  native().setFault('map-reserve', 0);
  native().setFault('map-map', 0);
  native().setFault('map-access', 0);
  for (const c of cleanup.splice(0).reverse()) await c();
});

const memfdMappings = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:')).length;

/** Whatever was imported was released, reserved freed, mapped unmapped. */
function expectBalanced(t: NativeVmmTimings): void {
  expect(t.release.items).toBe(t.import.items);
  expect(t.addressFree.items).toBe(t.reserve.items);
  expect(t.unmap.items).toBe(t.map.items);
}

function regions(sizes: number[]): HostRegion[] {
  const out = sizes.map((s) => HostRegion.create(s));
  cleanup.push(() => out.forEach((r) => r.close()));
  for (const r of out) r.write(0, randomFillSync(new Uint8Array(r.size)));
  return out;
}

const list = (rs: HostRegion[]) => rs.map((r) => ({ memory: { kind: 'host' as const, fd: r.fd }, size: r.size }));

describe('MappedRegions, batched form (host backend)', () => {
  it('reads and writes every region through one reservation, with one access call, and undoes it all on close', async () => {
    // Odd sizes: each is rounded up to a page inside the reservation.
    const rs = regions([5000, 1 << 20, (1 << 16) + 3, 4096, 3 * 4096 + 1, ...Array.from({ length: 35 }, (_, i) => (i + 1) * 4096)]);
    const original = rs.map((r) => r.read(0, r.size));
    const fds = openFds();
    const mappings = memfdMappings();
    const t0 = native().vmmTimings();

    const set = await MappedRegions.open(list(rs), { mapping: 'batched' });
    expect(set.mapping).toBe('batched');
    expect(memfdMappings()).toBe(mappings + rs.length);
    const opened = since(t0);
    expect(opened.import.items).toBe(rs.length);
    expect(opened.reserve).toMatchObject({ calls: 1, items: 1 });
    expect(opened.map.calls).toBe(rs.length);
    expect(opened.access).toMatchObject({ calls: 1, items: rs.length });
    expect(opened.closeFd.calls).toBe(rs.length); // the set's duplicates, closed once mapped

    // Capture through the batched mapping, clobber the memory, restore through another batched set.
    const store = await RegionStore.open(tempDir());
    const snap = await Snapshot.capture(store, 'batched', { regions: rs.map((r, i) => ({ key: `r${i}`, size: r.size, memory: set.memory(i) })) });
    await set.close();
    for (const r of rs) r.write(0, new Uint8Array(r.size));
    const again = await MappedRegions.open(list(rs), { mapping: 'batched' });
    await snap.restore({ regions: rs.map((r, i) => ({ key: `r${i}`, size: r.size, memory: again.memory(i) })) });
    await again.close();
    rs.forEach((r, i) => expect(r.read(0, r.size).equals(original[i]!), `region ${i}`).toBe(true));

    const all = since(t0);
    expectBalanced(all);
    expect(all.unmap.calls).toBe(2); // one call over each set's whole range
    expect(memfdMappings()).toBe(mappings);
    expect(openFds()).toEqual(fds);
  });

  it('per-region and auto: per-region maps each region on its own; auto is batched', async () => {
    const rs = regions([4096, 8192, 12288]);
    const perRegion = await MappedRegions.open(list(rs), { mapping: 'per-region' });
    expect(perRegion.mapping).toBe('per-region');
    await perRegion.close();
    const auto = await MappedRegions.open(list(rs));
    expect(auto.mapping).toBe('batched');
    await auto.close();
  });

  const faults: Array<[NativeMapFault, number, RegExp]> = [
    ['map-import', 17, /region \d+: injected fault at the batched import step/],
    ['map-reserve', 0, /injected fault at the batched reserve step/],
    ['map-map', 23, /region \d+: injected fault at the batched map step/],
    ['map-access', 0, /injected fault at the batched access step/],
  ];
  for (const [point, after, message] of faults) {
    it(`${point} fails (after ${after} hits): rejected, nothing imported, reserved, mapped or open is left`, async () => {
      const rs = regions(Array.from({ length: 40 }, () => 1 << 16));
      const fds = openFds();
      const mappings = memfdMappings();
      const t0 = native().vmmTimings();
      native().setFault(point, 1, after);
      const err = await MappedRegions.open(list(rs), { mapping: 'batched', threads: 4 }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(VsnapError);
      expect((err as VsnapError).code).toBe('E_IO');
      expect((err as VsnapError).message).toMatch(message);
      const t = since(t0);
      expectBalanced(t);
      if (point === 'map-map') expect(t.map.items).toBeGreaterThan(0); // some were mapped, then undone
      if (point === 'map-access') expect(t.map.items).toBe(rs.length);
      expect(memfdMappings()).toBe(mappings);
      expect(openFds()).toEqual(fds);
    });
  }

  it('auto falls back to one region at a time when the batched form fails, and still maps every region once', async () => {
    const rs = regions(Array.from({ length: 12 }, () => 1 << 16));
    const mappings = memfdMappings();
    const t0 = native().vmmTimings();
    native().setFault('map-map', 1, 5);
    const set = await MappedRegions.open(list(rs), { mapping: 'auto' });
    expect(set.mapping).toBe('per-region');
    expect(memfdMappings()).toBe(mappings + rs.length);
    const digests = await (await import('../../src/digest/index.js')).digestRegions(rs.map((r, i) => ({ size: r.size, chunkSize: 1 << 14, memory: set.memory(i) })));
    const direct = await (await import('../../src/digest/index.js')).digestRegions(rs.map((r) => ({ size: r.size, chunkSize: 1 << 14, memory: r.memory })));
    expect(digests.digests).toEqual(direct.digests);
    await set.close();
    expectBalanced(since(t0));
    expect(memfdMappings()).toBe(mappings);
  });

  it('an invalid region is not retried one at a time: it fails as it would', async () => {
    const rs = regions([1 << 16, 1 << 16]);
    const t0 = native().vmmTimings();
    const err = await MappedRegions.open([...list(rs), { memory: { kind: 'host', fd: rs[0]!.fd }, size: 1 << 20 }]).catch((e: unknown) => e);
    expect((err as VsnapError).code).toBe('E_INVALID_ARGUMENT');
    expect((err as VsnapError).message).toMatch(/region 2: .*holds 65536 bytes/);
    expectBalanced(since(t0));
  });

  it('pipelined: open returns at once, regions are mapped in batched chunks growing to 64, data intact both ways, nothing left', async () => {
    const rs = regions(Array.from({ length: 200 }, (_, i) => 4096 * (1 + (i % 4))));
    const original = rs.map((r) => r.read(0, r.size));
    const fds = openFds();
    const mappings = memfdMappings();
    const t0 = native().vmmTimings();
    const set = await MappedRegions.open(list(rs), { mapping: 'pipelined' });
    expect(set.mapping).toBe('pipelined');
    const store = await RegionStore.open(tempDir());
    const snap = await Snapshot.capture(store, 'pipelined', { regions: rs.map((r, i) => ({ key: `r${i}`, size: r.size, memory: set.memory(i) })) });
    await set.settled();
    const opened = since(t0);
    // Chunks of 16, 32, 64, 64, then the 24 left: no chunk past 64 regions, so the copy does not
    // catch up with the mapping (native/transfer/region_pipeline.cc).
    expect(opened.reserve.calls).toBe(5);
    expect(opened.access).toMatchObject({ calls: 5, items: rs.length });
    expect(opened.map.items).toBe(rs.length);
    await set.close();
    for (const r of rs) r.write(0, new Uint8Array(r.size));
    const again = await MappedRegions.open(list(rs), { mapping: 'pipelined' });
    await snap.restore({ regions: rs.map((r, i) => ({ key: `r${i}`, size: r.size, memory: again.memory(i) })) });
    await again.close();
    rs.forEach((r, i) => expect(r.read(0, r.size).equals(original[i]!), `region ${i}`).toBe(true));
    expectBalanced(since(t0));
    expect(memfdMappings()).toBe(mappings);
    expect(openFds()).toEqual(fds);
  });

  it('pipelined, a chunk fails to map: open still resolves, settled() and a copy into that chunk reject with the error, nothing is left', async () => {
    const rs = regions(Array.from({ length: 100 }, () => 1 << 14));
    const fds = openFds();
    const mappings = memfdMappings();
    const t0 = native().vmmTimings();
    native().setFault('map-map', 1, 30); // in the second chunk (regions 16..47)
    const set = await MappedRegions.open(list(rs), { mapping: 'pipelined' });
    await expect(set.settled()).rejects.toMatchObject({ code: 'E_IO', message: expect.stringMatching(/injected fault at the batched map step/) });
    const { digestRegions } = await import('../../src/digest/index.js');
    // The first chunk is mapped and readable; a region of a failed chunk fails at its first use.
    const head = await digestRegions([{ size: rs[0]!.size, chunkSize: 1 << 12, memory: set.memory(0) }]);
    expect(head.digests[0]).toHaveLength(4);
    await expect(digestRegions([{ size: rs[60]!.size, chunkSize: 1 << 12, memory: set.memory(60) }])).rejects.toMatchObject({ code: 'E_IO' });
    await set.close();
    expectBalanced(since(t0));
    expect(memfdMappings()).toBe(mappings);
    expect(openFds()).toEqual(fds);
  });

  it('pipelined, closed at once: the opener stops after its chunk; nothing mapped or open is left', async () => {
    const rs = regions(Array.from({ length: 600 }, () => 4096));
    const fds = openFds();
    const mappings = memfdMappings();
    const t0 = native().vmmTimings();
    const set = await MappedRegions.open(list(rs), { mapping: 'pipelined' });
    await set.close();
    expectBalanced(since(t0));
    expect(memfdMappings()).toBe(mappings);
    expect(openFds()).toEqual(fds);
  });
});
