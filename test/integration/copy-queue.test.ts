import { randomFillSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { native, type NativeHostBuffer } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { MappedRegions } from '../../src/regions/mapped.js';
import { CopyQueue } from '../../src/transfer/copy-queue.js';
import type { TransferRegion } from '../../src/transfer/transfer.js';
import { openFds } from '../helpers/faults.js';

// The copy queue (native/transfer/copy_queue.h) on host memory, which runs the same issuer and
// waiter threads, marks and failure paths as on a GPU (there the copies are asynchronous and the
// marks CUDA events; test/gpu/regions.gpu.test.ts runs it on device memory).

const MiB = 1024 * 1024;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  native().setFault('chunk-delay', 0);
  native().setFault('copy-fail', 0);
  for (const c of cleanup.splice(0).reverse()) await c();
});

const memfdMappings = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:')).length;

/** A RAM-tier buffer holding `bytes` (filled through a capture into it, as the RAM tier is). */
async function sourceOf(bytes: Buffer): Promise<NativeHostBuffer> {
  const b = native();
  const buffer = await b.createHostBuffer(bytes.length, -1);
  cleanup.push(() => buffer.close());
  const staging = HostRegion.create(bytes.length);
  staging.write(0, bytes);
  await b.startTransfer({
    op: 'capture',
    label: 'fill',
    hash: false,
    regions: [{ name: 'all', size: bytes.length, chunkSize: MiB, memory: staging.memory, hostCopy: { kind: 'buffer', buffer, offset: 0 } }],
  }).promise;
  staging.close();
  return buffer;
}

/** `count` regions of `size` bytes, their bytes in one RAM-tier buffer. */
async function setup(count: number, size: number) {
  const bytes = randomFillSync(Buffer.alloc(count * size));
  const buffer = await sourceOf(bytes);
  const targets = Array.from({ length: count }, () => HostRegion.create(size));
  cleanup.push(() => targets.forEach((t) => t.close()));
  const region = (i: number): TransferRegion => ({ name: `r${i}`, size, chunkSize: MiB, memory: targets[i]!.memory, hostCopy: { kind: 'buffer', buffer, offset: i * size } });
  const expectCopied = (i: number): void => expect(targets[i]!.read(0, size).equals(bytes.subarray(i * size, (i + 1) * size))).toBe(true);
  const expectUntouched = (i: number): void => expect(targets[i]!.read(0, size).equals(Buffer.alloc(size))).toBe(true);
  return { region, expectCopied, expectUntouched };
}

describe('CopyQueue', () => {
  it('lands batches in the order pushed, each settled with its bytes once it landed', async () => {
    const { region, expectCopied } = await setup(6, 2 * MiB);
    const fds = openFds().length;
    const landed: number[] = [];
    const q = CopyQueue.open('order', { onLanded: (n) => landed.push(n) });
    const a = q.push([region(0), region(1)]);
    const b = q.push([region(2)]);
    const c = q.push([]);
    const d = q.push([region(3), region(4), region(5)]);
    const [ra, rb, rc, rd] = await Promise.all([a, b, c, d]);
    expect([ra.id, rb.id, rc.id, rd.id]).toEqual([1, 2, 3, 4]);
    expect([ra.bytes, rb.bytes, rc.bytes, rd.bytes]).toEqual([4 * MiB, 2 * MiB, 0, 6 * MiB]);
    expect(rc.issuedAt).toBe(-1);
    // FIFO: each landed no earlier than the one before it
    expect(ra.landedAt).toBeLessThanOrEqual(rb.landedAt);
    expect(rb.landedAt).toBeLessThanOrEqual(rd.landedAt);
    for (let i = 0; i < 6; i++) expectCopied(i);
    expect(q.landed).toBe(12 * MiB);
    await q.close();
    expect(openFds().length).toBe(fds); // every target's duplicate descriptor closed
    expect(memfdMappings()).toBe(0);
  });

  it('takes a batch pushed while another is still copying, and lands it after', async () => {
    const { region, expectCopied } = await setup(2, 4 * MiB);
    native().setFault('chunk-delay', 1000, 5); // every chunk waits 5 ms: the first batch is in flight when the second comes
    const q = CopyQueue.open('behind');
    const first = q.push([region(0)]);
    const second = q.push([region(1)]);
    const [r1, r2] = await Promise.all([first, second]);
    expect(r2.issuedAt).toBeGreaterThanOrEqual(r1.issuedAt);
    expect(r2.landedAt).toBeGreaterThanOrEqual(r1.landedAt);
    expectCopied(0);
    expectCopied(1);
    await q.close();
  });

  it('a copy that fails rejects its batch and every later one with that error; the earlier ones landed, nothing is left open', async () => {
    const { region, expectCopied, expectUntouched } = await setup(4, 2 * MiB);
    const fds = openFds().length;
    const q = CopyQueue.open('fails', { chunkSize: MiB });
    native().setFault('copy-fail', 1, 3); // chunks 1-3 copy (region 0, half of region 1), the 4th fails
    const ok = q.push([region(0)]);
    const bad = q.push([region(1)]);
    const later = q.push([region(2), region(3)]);
    await expect(ok).resolves.toMatchObject({ bytes: 2 * MiB });
    await expect(bad).rejects.toMatchObject({ code: 'E_CUDA', message: expect.stringMatching(/injected fault: a copy of 'fails' failed \(region 'r1'\)/) });
    await expect(later).rejects.toMatchObject({ code: 'E_CUDA', message: expect.stringMatching(/region 'r1'/) });
    expectCopied(0);
    expectUntouched(2);
    expectUntouched(3);
    await expect(q.push([region(2)])).rejects.toMatchObject({ code: 'E_CUDA' }); // a push after the failure fails the same way
    expectUntouched(2);
    await q.close();
    expect(openFds().length).toBe(fds);
    expect(memfdMappings()).toBe(0);
  });

  it('cancel stops at the next chunk: what is left rejects with E_ABORTED once nothing is in flight, and close ends it', async () => {
    const { region, expectUntouched } = await setup(3, 8 * MiB);
    const fds = openFds().length;
    native().setFault('chunk-delay', 1000, 5);
    const q = CopyQueue.open('cancelled');
    const first = q.push([region(0)]);
    const second = q.push([region(1), region(2)]);
    q.cancel();
    await expect(first).rejects.toMatchObject({ code: 'E_ABORTED' });
    await expect(second).rejects.toMatchObject({ code: 'E_ABORTED' });
    expectUntouched(2);
    await q.close();
    await expect(q.push([region(0)])).rejects.toMatchObject({ code: 'E_CLOSED' });
    expect(openFds().length).toBe(fds);
    expect(memfdMappings()).toBe(0);
  });

  it('an aborted signal cancels it and rejects with the abort, as any transfer does', async () => {
    const { region } = await setup(2, 8 * MiB);
    native().setFault('chunk-delay', 1000, 5);
    const abort = new AbortController();
    const q = CopyQueue.open('signal', { signal: abort.signal });
    const batch = q.push([region(0), region(1)]);
    abort.abort(new Error('stop now'));
    await expect(batch).rejects.toMatchObject({ code: 'E_ABORTED', message: expect.stringMatching(/copy of 'signal'/) });
    await q.close();
    expect(() => CopyQueue.open('late', { signal: abort.signal })).toThrow(expect.objectContaining({ code: 'E_ABORTED' }));
  });

  it('refuses a target smaller than its copy without copying into it, and every batch after', async () => {
    const { region, expectUntouched } = await setup(2, 2 * MiB);
    const small = HostRegion.create(MiB);
    cleanup.push(() => small.close());
    const q = CopyQueue.open('small');
    const refused = q.push([{ ...region(0), memory: small.memory }]);
    const after = q.push([region(1)]);
    await expect(refused).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/holds 1048576 bytes, less than the 2097152/) });
    await expect(after).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    expect(small.read(0, MiB).equals(Buffer.alloc(MiB))).toBe(true);
    expectUntouched(1);
    await q.close();
  });

  it('a thread that cannot start: a coded error, nothing left running', async () => {
    native().setFault('thread-start', 1, 1); // the issuer starts, the waiter cannot
    try {
      expect(() => CopyQueue.open('threads')).toThrow(expect.objectContaining({ code: 'E_INTERNAL', message: expect.stringMatching(/thread limit/) }));
    } finally {
      native().setFault('thread-start', 0);
    }
    const q = CopyQueue.open('after');
    await q.push([]);
    await q.close();
  });
});

describe('CopyQueue: regions mapped side by side', () => {
  /** `sizes` regions mapped as one set (one reservation, side by side), their bytes back to back in one RAM-tier buffer. */
  async function mappedSetup(sizes: readonly number[], sourceGap = 0) {
    const offsets: number[] = [];
    let total = 0;
    for (const size of sizes) {
      offsets.push(total);
      total += size + sourceGap;
    }
    const bytes = randomFillSync(Buffer.alloc(total));
    const buffer = await sourceOf(bytes);
    const owned = sizes.map((size) => HostRegion.create(size));
    cleanup.push(() => owned.forEach((t) => t.close()));
    const set = await MappedRegions.open(owned.map((t, i) => ({ memory: t.memory, size: sizes[i]! })), { mapping: 'batched' });
    cleanup.push(() => set.close());
    expect(set.mapping).toBe('batched');
    const region = (i: number): TransferRegion => ({ name: `r${i}`, size: sizes[i]!, chunkSize: MiB, memory: set.memory(i), hostCopy: { kind: 'buffer', buffer, offset: offsets[i]! } });
    const expectCopied = (i: number): void => expect(owned[i]!.read(0, sizes[i]!).equals(bytes.subarray(offsets[i]!, offsets[i]! + sizes[i]!))).toBe(true);
    const expectUntouched = (i: number): void => expect(owned[i]!.read(0, sizes[i]!).equals(Buffer.alloc(sizes[i]!))).toBe(true);
    return { region, expectCopied, expectUntouched, set };
  }

  it('joins the copies of regions whose targets and sources both meet, up to the chunk size each', async () => {
    const sizes = Array.from({ length: 40 }, () => 64 * 1024); // 2.5 MiB in all
    const { region, expectCopied } = await mappedSetup(sizes);
    const q = CopyQueue.open('joined', { chunkSize: MiB });
    const all = await q.push(sizes.map((_, i) => region(i)));
    expect(all).toMatchObject({ bytes: 40 * 64 * 1024, copies: 3 }); // 1 MiB, 1 MiB, 0.5 MiB
    for (let i = 0; i < sizes.length; i++) expectCopied(i);
    // The same regions in reverse order: no target meets the one before it, one copy each.
    const reversed = await q.push(sizes.map((_, i) => region(sizes.length - 1 - i)));
    expect(reversed.copies).toBe(40);
    await q.close();
  });

  it('does not join across a gap in the sources, nor into the padding of a region smaller than its mapping', async () => {
    const page = 4096;
    const gapped = await mappedSetup([8 * page, 8 * page, 8 * page], page); // targets meet, sources do not
    const q = CopyQueue.open('gaps', { chunkSize: MiB });
    expect((await q.push([0, 1, 2].map((i) => gapped.region(i)))).copies).toBe(3);
    for (const i of [0, 1, 2]) gapped.expectCopied(i);
    // 5,000-byte regions are mapped a page each: the copy of one ends before the next begins.
    const odd = await mappedSetup([5000, 5000, 5000]);
    expect((await q.push([0, 1, 2].map((i) => odd.region(i)))).copies).toBe(3);
    for (const i of [0, 1, 2]) odd.expectCopied(i);
    await q.close();
  });

  it('a joined copy that fails fails its batch; the regions copied before it hold their bytes, nothing stays mapped once the set is closed', async () => {
    const sizes = Array.from({ length: 8 }, () => 256 * 1024);
    const { region, expectCopied, expectUntouched, set } = await mappedSetup(sizes);
    const fds = openFds().length;
    const q = CopyQueue.open('joined-fails', { chunkSize: MiB });
    native().setFault('copy-fail', 1, 1); // the first joined copy (regions 0-3) lands, the second (4-7) fails
    await expect(q.push(sizes.map((_, i) => region(i)))).rejects.toMatchObject({ code: 'E_CUDA', message: expect.stringMatching(/region 'r4'/) });
    for (const i of [0, 1, 2, 3]) expectCopied(i);
    for (const i of [4, 5, 6, 7]) expectUntouched(i);
    await q.close();
    await set.close();
    expect(openFds().length).toBe(fds);
    expect(memfdMappings()).toBe(0);
  });
});
