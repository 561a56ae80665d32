import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { native, type NativeHostBuffer, type NativeMultipathSpec } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { runMultipath } from '../../src/transfer/multipath.js';
import { fillRegion, holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

// Multi-path hydrate's scheduler (native/transfer/multipath.cc) on the host backend: the real
// job, its worker threads and its queue, with copies in host memory that complete only when
// waited for (as asynchronous GPU copies do), so a ring slot reused before its peer copy
// completed is caught by the backend (E_INTERNAL) and corrupts the bytes.
//
// Which path takes which chunk is left to thread scheduling in production; these tests fix it
// with the host backend's schedule (faults.relayChunks: the neighbour path takes the last N
// chunks, the direct path waits for that; faults.holdRelay: the neighbour's copies complete only
// once the direct path has taken the rest), so that no assertion depends on which thread runs
// first on a busy machine. Delays, where left, only make durations non-zero.

const KiB = 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

/** Sources in a HostBuffer (filled by a real capture into it) and zeroed host targets. */
async function setup(sizes: Record<string, number>) {
  const src = patternedRegions(sizes);
  for (const r of src.values()) cleanup.push(r);
  const total = Object.values(sizes).reduce((s, n) => s + n, 0);
  const buffer = await native().createHostBuffer(total, -1);
  cleanup.push(buffer);
  const offsets = new Map<string, number>();
  let at = 0;
  for (const [k, n] of Object.entries(sizes)) {
    offsets.set(k, at);
    at += n;
  }
  await native().startTransfer({
    op: 'capture',
    label: 'fill',
    regions: [...src].map(([key, r]) => ({ name: key, size: r.size, chunkSize: 64 * KiB, memory: r.memory, hostCopy: { kind: 'buffer', buffer, offset: offsets.get(key)! } })),
  }).promise;
  const targets = patternedRegions(sizes);
  for (const r of targets.values()) {
    cleanup.push(r);
    fillRegion(r, 0);
  }
  const regions = [...targets].map(([key, r]) => ({ name: key, size: r.size, memory: r.memory, source: { buffer, offset: offsets.get(key)! } }));
  const intact = () => [...targets].every(([key, r]) => holdsPattern(r, key));
  return { buffer, targets, regions, intact, total };
}

function nativeSpec(regions: Awaited<ReturnType<typeof setup>>['regions'], extra: Partial<NativeMultipathSpec>): NativeMultipathSpec {
  return {
    label: 'mp',
    backend: 'host',
    chunkSize: 64 * KiB,
    relaySlots: 4,
    regions: regions.map((r) => ({ name: r.name, size: r.size, memory: { kind: 'host', fd: (r.memory as { fd: number }).fd }, source: { kind: 'buffer', buffer: r.source.buffer as NativeHostBuffer, offset: r.source.offset } })),
    ...extra,
  };
}

describe('multi-path hydrate: the scheduler on the host backend', () => {
  it('splits the chunks between both paths from one queue and writes every byte', async () => {
    const { regions, intact, total } = await setup({ a: 3 * 1024 * KiB + 5, b: 1024 * KiB, c: 4096 });
    // 66 chunks: the neighbour takes the last 10 (c's 4096 bytes and b's 9 last), the direct path the rest
    const r = await runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, regions, testFaults: { relayChunks: 10 } });
    expect(r.bytes).toBe(total);
    expect(r.bytesDirect + r.bytesRelay).toBe(total);
    expect(r.chunksRelay).toBe(10);
    expect(r.chunksDirect).toBe(56);
    expect(r.bytesRelay).toBe(9 * 64 * KiB + 4096);
    expect(r).toMatchObject({ relayUsed: true, relayCancelled: false, relayError: '', requeued: 0 });
    expect(intact()).toBe(true);
  });

  it('a busy neighbour takes fewer chunks: a path takes one only when a slot of its own is free', async () => {
    const { regions, intact } = await setup({ a: 48 * 64 * KiB });
    // its copies do not complete while the direct path has chunks to take: it takes its 4 slots' worth and no more
    const r = await runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, regions, testFaults: { holdRelay: true } });
    expect(r.chunksRelay).toBe(4);
    expect(r.chunksDirect).toBe(44);
    expect(r).toMatchObject({ relayError: '', requeued: 0 });
    expect(intact()).toBe(true);
  });

  it('back-pressure: a ring slot is refilled only after its peer copy completed', async () => {
    const { regions, intact } = await setup({ a: 40 * 64 * KiB });
    // 2 ring slots, 10 chunks through them; the backend rejects a slot reused before its wait (E_INTERNAL)
    const r = await runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, ringSlots: 2, regions, testFaults: { relayChunks: 10 } });
    expect(r.relayError).toBe(''); // no slot was reused early (the backend would have failed the relay path)
    expect(r.maxRelayInFlight).toBe(2);
    expect(r.chunksRelay).toBe(10);
    expect(intact()).toBe(true);
  });

  it('the neighbour released mid-restore: it takes no more chunks, its ring is freed, the direct path finishes, every byte is right', async () => {
    const { regions, intact, total } = await setup({ a: 40 * 64 * KiB });
    // the neighbour holds its 4 chunks in flight and the direct path waits for it: nothing ends before the release
    const h = native().startMultipath(nativeSpec(regions, { faults: { relayChunks: 40, holdRelay: true } }), () => {});
    let settled = false;
    const done = h.promise.finally(() => (settled = true));
    while (h.ringBytes() === 0) await new Promise((r) => setTimeout(r, 5)); // the job is built off the JS thread; the test's timeout bounds this
    expect(h.ringBytes()).toBe(4 * 64 * KiB);
    expect(settled).toBe(false);
    h.cancelRelay();
    const r = await done;
    expect(h.ringBytes()).toBe(0);
    expect(r).toMatchObject({ relayUsed: true, relayCancelled: true, bytes: total, requeued: 0, relayError: '' });
    // those it had taken (its ring's worth at most: up to 4, as far as it got before the release) completed; no more were taken
    expect(r.chunksRelay).toBeLessThanOrEqual(4);
    expect(r.chunksRelay + r.chunksDirect).toBe(40);
    expect(r.bytesDirect + r.bytesRelay).toBe(total);
    expect(intact()).toBe(true);
  });

  it('releaseNeighbour already aborted: all bytes go direct', async () => {
    const { regions, intact, total } = await setup({ a: 16 * 64 * KiB });
    const r = await runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, regions, releaseNeighbour: AbortSignal.abort() });
    expect(r).toMatchObject({ bytesDirect: total, bytesRelay: 0, relayCancelled: true });
    expect(intact()).toBe(true);
  });

  it('each path keeps all its slots in flight, and reports when it was busy', async () => {
    const { regions, intact, total } = await setup({ a: 48 * 64 * KiB });
    // 12 chunks to the neighbour, 36 direct: each path has more chunks than slots (the delays only make durations non-zero)
    const r = await runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, directSlots: 6, ringSlots: 3, regions, testFaults: { relayChunks: 12, relayDelayMs: 1, directDelayMs: 1 } });
    expect(r.bytesDirect + r.bytesRelay).toBe(total);
    expect(r.chunksRelay).toBe(12);
    // a path waits for its oldest copy only when it comes back to that slot: the host backend
    // completes a copy only at its wait, so every slot was filled before the first wait
    expect(r.direct.maxInFlight).toBe(6);
    expect(r.relay.maxInFlight).toBe(3);
    expect(r.maxRelayInFlight).toBe(3);
    for (const p of [r.direct, r.relay]) {
      expect(p.firstStart).toBeGreaterThanOrEqual(0);
      expect(p.lastEnd).toBeGreaterThan(p.firstStart);
      expect(p.busySeconds).toBeGreaterThan(0);
      expect(p.busySeconds).toBeLessThanOrEqual(p.lastEnd - p.firstStart + 1e-6);
    }
    expect(r.setupSeconds).toBeGreaterThanOrEqual(0);
    expect(r.teardownSeconds).toBeGreaterThanOrEqual(0);
    expect(r.setupSeconds + r.teardownSeconds).toBeLessThanOrEqual(r.seconds);
    expect(intact()).toBe(true);
  });

  it('released before the start: no neighbour path is set up at all (no ring), the direct path does it all', async () => {
    const { regions, intact, total } = await setup({ a: 24 * 64 * KiB });
    const h = native().startMultipath(nativeSpec(regions, { relayReleased: true, faults: { directDelayMs: 5 } }));
    let settled = false;
    const done = h.promise.finally(() => (settled = true));
    let ringSeen = 0;
    while (!settled) {
      ringSeen = Math.max(ringSeen, h.ringBytes());
      await new Promise((r) => setTimeout(r, 2));
    }
    const r = await done;
    expect(ringSeen).toBe(0);
    expect(r).toMatchObject({ relayUsed: false, relayCancelled: true, bytesDirect: total, bytesRelay: 0, chunksRelay: 0 });
    expect(r.relayError).toMatch(/released before the restore started/);
    expect(r.relay).toMatchObject({ firstStart: -1, lastEnd: -1, busySeconds: 0, maxInFlight: 0 });
    expect(intact()).toBe(true);
  });

  it('a chunk failing on the neighbour path goes back to the direct path (after a partial write), and the restore succeeds', async () => {
    const { regions, intact, total } = await setup({ a: 32 * 64 * KiB });
    const r = await runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, regions, testFaults: { failRelayAt: 3, relayChunks: 8 } });
    expect(r.relayError).toMatch(/injected fault: peer copy 3 failed/);
    // copies 1 to 4 fill the ring; 1 and 2 complete, 5 and 6 follow them; 3 fails: 4 to 6 are drained (complete)
    expect(r).toMatchObject({ requeued: 1, chunksRelay: 5, chunksDirect: 27 });
    expect(r.bytesDirect + r.bytesRelay).toBe(total);
    expect(intact()).toBe(true); // the garbage the failed copy left was written over
  });

  it('a chunk failing on the direct path fails the restore (never reported as success) and frees the ring', async () => {
    const { regions } = await setup({ a: 32 * 64 * KiB });
    const h = native().startMultipath(nativeSpec(regions, { faults: { failDirectAt: 5, relayChunks: 4 } })); // 28 chunks go direct
    await expect(h.promise).rejects.toMatchObject({ code: 'E_CUDA', message: expect.stringMatching(/direct copy 5 failed/) });
    expect(h.ringBytes()).toBe(0);
  });

  it('a cancelled restore rejects with E_ABORTED and frees the ring', async () => {
    const { regions } = await setup({ a: 32 * 64 * KiB });
    // held (the neighbour's copies do not complete, the direct path waits for it) until cancelled
    const held = { relayChunks: 32, holdRelay: true };
    const h = native().startMultipath(nativeSpec(regions, { faults: held }));
    while (h.ringBytes() === 0) await new Promise((r) => setTimeout(r, 5)); // the job is built off the JS thread; the test's timeout bounds this
    h.cancel();
    await expect(h.promise).rejects.toMatchObject({ code: 'E_ABORTED' });
    expect(h.ringBytes()).toBe(0);
    const ac = new AbortController(); // and through the SDK, with a signal, once the job has started
    const p = runMultipath({ label: 'mp', neighbour: 1, chunkSize: 64 * KiB, regions, signal: ac.signal, testFaults: held });
    ac.abort();
    await expect(p).rejects.toMatchObject({ code: 'E_ABORTED' });
  });

  it('checks its options', async () => {
    const { regions } = await setup({ a: 64 * KiB });
    await expect(runMultipath({ label: 'mp', neighbour: -1, regions })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(runMultipath({ label: 'mp', neighbour: 1, chunkSize: 1000, regions })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(runMultipath({ label: 'mp', neighbour: 1, ringSlots: 0, regions })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});

describe('multi-path hydrate through Snapshot.restore (RAM tier, host memory)', () => {
  it('restores bit-exact over both paths and reports the split', async () => {
    const store = await RegionStore.open(tempDir());
    const sizes = { a: 3 * 1024 * KiB + 5, b: 2 * 1024 * KiB };
    const src = patternedRegions(sizes);
    for (const r of src.values()) cleanup.push(r);
    const snap = await Snapshot.capture(store, 'm', { regions: [...src].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize: 256 * KiB });
    const cache = await RamTier.create({ budgetBytes: 16 * 1024 * KiB, pin: false });
    cleanup.push(cache);
    const targets = patternedRegions(sizes);
    for (const r of targets.values()) {
      cleanup.push(r);
      fillRegion(r, 0);
    }
    const regions = [...targets].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
    // 81 chunks, the last 16 to the neighbour (the delays only make durations non-zero)
    const r = await snap.restore({ regions, ram: cache, multipath: { neighbour: 1, chunkSize: 64 * KiB, testFaults: { relayChunks: 16, relayDelayMs: 1, directDelayMs: 1 } } });
    expect(r.multipath).toMatchObject({ neighbourUsed: true, neighbourReleased: false, requeuedChunks: 0 });
    expect(r.multipath!.bytesDirect + r.multipath!.bytesNeighbour).toBe(r.bytes);
    expect(r.multipath!.bytesNeighbour).toBe(16 * 64 * KiB);
    expect(r.multipath!.timeline.direct.maxInFlight).toBe(4); // the default: 4 copies in flight per path
    expect(r.multipath!.timeline.neighbour.maxInFlight).toBe(4);
    expect(r.multipath!.timeline.copySeconds).toBeGreaterThan(0);
    for (const [key, t] of targets) expect(holdsPattern(t, key)).toBe(true);
    expect(r.digestSeconds).toBeDefined(); // and the restored memory was digested against the manifest
  });
});
