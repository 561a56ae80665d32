// GPU suite (device only): `npm run test:gpu -- dist-gpu/mapped.gpu.test.mjs` (or the whole suite).
// Issue 14, "no work twice" on real device memory: a restore through one MappedRegions set imports
// every exported region once (the hydrate and its GPU digest share the mapping), and the bytes
// come back bit-identical. Exported fds of this process's own allocations stand in for an
// engine's (cuMemImportFromShareableHandle does not care who exported them).
import assert from 'node:assert/strict';
import { closeSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

import { cudaStatus, RamTier, RegionStore, Snapshot } from '../../src/index.js';
import { DeviceAllocation, MappedRegions } from '../../src/plumbing.js';
import type { RegionMemory } from '../../src/index.js';
import { native, type NativeMapFault, type NativeVmmTimings } from '../../src/native/index.js';
import { vmmSince as since } from '../helpers/vmm.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { CopyQueue } from '../../src/transfer/copy-queue.js';

const MiB = 1024 * 1024;

describe('MappedRegions on the GPU', async () => {
  const status = await cudaStatus();
  it('restores 300 regions from the RAM tier with one import each, verified by digest, bit-identical', { skip: !status.available }, async () => {
    const sizes = [...Array.from({ length: 299 }, () => 2 * MiB), 256 * MiB];
    const allocations = await Promise.all(sizes.map((s) => DeviceAllocation.allocate(0, s)));
    const fds = allocations.map((a) => a.exportFd());
    const root = mkdtempSync(join(tmpdir(), 'vsnap-mapped-'));
    const cache = await RamTier.create({ budgetBytes: 1024 * MiB });
    try {
      for (const [i, a] of allocations.entries()) await a.fill(0, a.size, (i * 7 + 1) & 0xff);
      const regions = allocations.map((a, i) => ({ key: `r${i}`, size: a.size, memory: { kind: 'imported', fd: fds[i]!, device: 0 } as RegionMemory }));
      const store = await RegionStore.open(root);
      const snap = await Snapshot.capture(store, 'mapped', { regions, ram: cache });
      for (const a of allocations) await a.fill(0, a.size, 0);

      const before = native().regionCounters().imports;
      const set = await MappedRegions.open(regions);
      assert.equal(set.mapping, 'batched', 'exported GPU memory is mapped in the batched form by default');
      const result = await snap.restore({ regions: regions.map((r, i) => ({ ...r, memory: set.memory(i) })), ram: cache });
      await set.close();
      assert.equal(native().regionCounters().imports - before, regions.length, 'one import per region for the hydrate and the digest together');
      assert.equal(result.tier, 'ram');
      assert.ok(result.digestSeconds !== undefined, 'the restore was verified by GPU digest');
      for (const [i, a] of allocations.entries()) {
        const head = await a.read(0, 4096);
        assert.ok(head.every((b) => b === ((i * 7 + 1) & 0xff)), `region ${i} restored`);
      }
    } finally {
      cache.close();
      for (const fd of fds) closeSync(fd);
      for (const a of allocations) a.close();
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe('the copy queue joins copies into imported regions mapped side by side, on the GPU', async () => {
  const status = await cudaStatus();
  it('96 exported allocations of 2 MiB, one batched set: 3 copies of 64 MiB, every byte in place; reversed, one copy each', { skip: !status.available }, async () => {
    const n = 96;
    const size = 2 * MiB;
    const allocations = await Promise.all(Array.from({ length: n }, () => DeviceAllocation.allocate(0, size)));
    const fds = allocations.map((a) => a.exportFd());
    const bytes = Buffer.alloc(n * size);
    for (let i = 0; i < n; i++) for (let k = 0; k < size; k += 4096) bytes.writeUInt32LE((i << 20) | (k >> 12), i * size + k); // every page says where it belongs
    const b = native();
    const buffer = await b.createHostBuffer(bytes.length, 0);
    const staging = HostRegion.create(bytes.length);
    let set: MappedRegions | undefined;
    try {
      staging.write(0, bytes);
      await b.startTransfer({ op: 'capture', label: 'fill', hash: false, regions: [{ name: 'all', size: bytes.length, chunkSize: 64 * MiB, memory: staging.memory, hostCopy: { kind: 'buffer', buffer, offset: 0 } }] }).promise;
      set = await MappedRegions.open(fds.map((fd) => ({ size, memory: { kind: 'imported', fd, device: 0 } as RegionMemory })), { mapping: 'batched' });
      const region = (i: number) => ({ name: `r${i}`, size, chunkSize: 64 * MiB, memory: set!.memory(i), hostCopy: { kind: 'buffer' as const, buffer, offset: i * size } });
      const q = CopyQueue.open('joined');
      try {
        const joined = await q.push(Array.from({ length: n }, (_, i) => region(i)));
        assert.equal(joined.copies, 3, '192 MiB side by side in one reservation: three copies of 64 MiB');
        for (const [i, a] of allocations.entries()) assert.ok((await a.read(0, size)).equals(bytes.subarray(i * size, (i + 1) * size)), `region ${i} holds its own bytes`);
        for (const a of allocations) await a.fill(0, size, 0);
        const reversed = await q.push(Array.from({ length: n }, (_, i) => region(n - 1 - i)));
        assert.equal(reversed.copies, n, 'no target meets the one before it: one copy each');
        for (const [i, a] of allocations.entries()) assert.ok((await a.read(0, size)).equals(bytes.subarray(i * size, (i + 1) * size)), `region ${i} holds its own bytes (reversed)`);
      } finally {
        await q.close();
      }
    } finally {
      await set?.close();
      staging.close();
      buffer.close();
      for (const fd of fds) closeSync(fd);
      for (const a of allocations) a.close();
    }
  });
});

/** Every handle imported was released, every reservation freed, every mapping unmapped. */
function assertBalanced(t: NativeVmmTimings, what: string): void {
  assert.equal(t.release.items, t.import.items, `${what}: imports released`);
  assert.equal(t.addressFree.items, t.reserve.items, `${what}: reservations freed`);
  assert.equal(t.unmap.items, t.map.items, `${what}: mappings unmapped`);
}

describe('MappedRegions, batched form, on the GPU (issue 14, per-region cost)', async () => {
  const status = await cudaStatus();
  it('maps 257 exported allocations of mixed sizes with one reservation and one cuMemSetAccess, data intact both ways, nothing left', { skip: !status.available }, async () => {
    // Mixed sizes (2 MiB granularity multiples and not), so offsets differ from a plain stride.
    const sizes = Array.from({ length: 257 }, (_, i) => (i % 5 === 0 ? 6 * MiB + 4096 : (1 + (i % 3)) * 2 * MiB));
    const allocations = await Promise.all(sizes.map((s) => DeviceAllocation.allocate(0, s)));
    const fds = allocations.map((a) => a.exportFd());
    const root = mkdtempSync(join(tmpdir(), 'vsnap-batched-'));
    const cache = await RamTier.create({ budgetBytes: 2048 * MiB });
    try {
      for (const [i, a] of allocations.entries()) await a.fill(0, a.size, (i * 11 + 3) & 0xff);
      const regions = allocations.map((a, i) => ({ key: `r${i}`, size: sizes[i]!, memory: { kind: 'imported', fd: fds[i]!, device: 0 } as RegionMemory }));
      const store = await RegionStore.open(root);
      const t0 = native().vmmTimings();
      const reading = await MappedRegions.open(regions, { mapping: 'batched' });
      const opened = since(t0);
      assert.equal(reading.mapping, 'batched');
      assert.equal(opened.import.items, regions.length);
      assert.deepEqual([opened.reserve.calls, opened.access.calls, opened.access.items], [1, 1, regions.length], 'one reservation, one access call over all');
      assert.equal(opened.map.calls, regions.length);
      // Capture reads through the batched mapping; restore writes through another one.
      const snap = await Snapshot.capture(store, 'batched', { regions: regions.map((r, i) => ({ ...r, memory: reading.memory(i) })), ram: cache });
      await reading.close();
      for (const a of allocations) await a.fill(0, a.size, 0);
      const writing = await MappedRegions.open(regions, { mapping: 'batched' });
      const result = await snap.restore({ regions: regions.map((r, i) => ({ ...r, memory: writing.memory(i) })), ram: cache });
      await writing.close();
      assert.ok(result.digestSeconds !== undefined, 'verified by GPU digest through the batched mapping');
      for (const [i, a] of allocations.entries()) {
        const tail = await a.read(sizes[i]! - 4096, 4096);
        const head = await a.read(0, 4096);
        assert.ok(head.every((b) => b === ((i * 11 + 3) & 0xff)) && tail.every((b) => b === ((i * 11 + 3) & 0xff)), `region ${i} restored`);
      }
      // Pipelined: the copy starts on the first chunks while the rest are mapped.
      for (const a of allocations) await a.fill(0, a.size, 0);
      const pipelined = await MappedRegions.open(regions, { mapping: 'pipelined' });
      assert.equal(pipelined.mapping, 'pipelined');
      const again = await snap.restore({ regions: regions.map((r, i) => ({ ...r, memory: pipelined.memory(i) })), ram: cache });
      await pipelined.settled();
      await pipelined.close();
      assert.ok(again.digestSeconds !== undefined, 'verified by GPU digest through the pipelined set');
      for (const [i, a] of allocations.entries()) {
        const tail = await a.read(sizes[i]! - 4096, 4096);
        assert.ok(tail.every((b) => b === ((i * 11 + 3) & 0xff)), `region ${i} restored (pipelined)`);
      }
      const all = since(t0);
      assertBalanced(all, 'two batched sets and a pipelined one');
      console.log(`batched + pipelined: ${all.unmap.calls} cuMemUnmap calls for ${all.unmap.items} regions in ${all.reserve.calls} reservations (one call per reservation: the driver unmaps several mappings at once; more: it refused the range)`);
    } finally {
      cache.close();
      for (const fd of fds) closeSync(fd);
      for (const a of allocations) a.close();
      rmSync(root, { recursive: true, force: true });
    }
  });

  const faults: Array<[NativeMapFault, number]> = [['map-import', 40], ['map-reserve', 0], ['map-map', 50], ['map-access', 0]];
  it('a failure at import, reserve, map or access leaves nothing imported, reserved or mapped, and the memory intact', { skip: !status.available }, async () => {
    const allocations = await Promise.all(Array.from({ length: 96 }, () => DeviceAllocation.allocate(0, 2 * MiB)));
    const fds = allocations.map((a) => a.exportFd());
    try {
      for (const [i, a] of allocations.entries()) await a.fill(0, a.size, i & 0xff);
      const regions = allocations.map((a) => ({ size: a.size, memory: { kind: 'imported', fd: fds[allocations.indexOf(a)]!, device: 0 } as RegionMemory }));
      for (const [point, after] of faults) {
        const t0 = native().vmmTimings();
        native().setFault(point, 1, after);
        const err = await MappedRegions.open(regions, { mapping: 'batched' }).catch((e: unknown) => e);
        native().setFault(point, 0);
        assert.equal((err as { code?: string }).code, 'E_CUDA', `${point}: rejected`);
        assertBalanced(since(t0), point);
        // auto falls back to one region at a time and still works
        native().setFault(point, 1, after);
        const set = await MappedRegions.open(regions);
        native().setFault(point, 0);
        assert.equal(set.mapping, 'per-region', `${point}: auto fell back`);
        await set.close();
        assertBalanced(since(t0), `${point} + fallback`);
      }
      for (const [i, a] of allocations.entries()) assert.ok((await a.read(0, 4096)).every((b) => b === (i & 0xff)), `allocation ${i} intact`);
    } finally {
      for (const fd of fds) closeSync(fd);
      for (const a of allocations) a.close();
    }
  });
});
