// The plumbing of a restore of coded store blobs onto GPUs (src/snapshot/store-decode.ts) that
// needs no GPU: which regions take it, the windows (bounded, every chunk once, in order), the
// headers of every chunk checked before any window is decoded, truncated blobs refused first,
// and the windows' bytes as read from disk into the two alternating buffers, decoded here by the
// CPU codec in place of the GPU (the GPU suite's store-codec.gpu.test.ts runs the GPU decoder).
// Restores into host memory keep the CPU decode (coded-store-restore.test.ts). And the addon's
// reader of byte ranges into a HostBuffer (readFilesInto) the windows are read with.
import { readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { native, type NativeHostBuffer } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import type { DeviceDecodeItem, DeviceDecodeResult } from '../../src/snapshot/device-decode.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { decodesOnDevice, decodeStoreOnDevices, planWindows } from '../../src/snapshot/store-decode.js';
import { codedOffsets } from '../../src/store/coded-blob.js';
import { RegionStore } from '../../src/store/region-store.js';
import { decodeChunk } from '../../src/transfer/codec.js';
import { windowBuffers } from '../../src/transfer/window-buffers.js';
import { randomChunk, weights } from '../helpers/codec-data.js';
import { allBytes, fillRegion } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const KiB = 1024;
const CHUNK = 256 * KiB;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
  windowBuffers.releaseIdle();
});

const contents: Record<string, Buffer> = {
  'bf16.a': weights('bf16', 'gaussian', 5 * CHUNK + 1000, 11),
  'fp32.b': weights('fp32', 'gaussian', 2 * CHUNK + 4096, 12),
  'random.c': randomChunk(CHUNK, 13), // does not shrink: stays a raw blob
};

async function captured() {
  const store = await RegionStore.open(tempDir());
  const regions = Object.entries(contents).map(([key, bytes]) => {
    const r = HostRegion.create(bytes.length);
    cleanup.push(r);
    r.write(0, bytes);
    const dtype = key.startsWith('bf16') ? 'torch.bfloat16' : key.startsWith('fp32') ? 'torch.float32' : undefined;
    return { key, size: bytes.length, memory: r.memory, tensors: dtype ? [{ name: key, offset: 0, dtype, shape: [bytes.length] }] : [] };
  });
  const snap = await Snapshot.capture(store, 'm', { regions, chunkSize: CHUNK, codec: 'vsnap-c1' });
  const coded = [...snap.manifest.regions()].map(({ region }) => region).filter((r) => r.codec);
  const targets = coded.map((region) => {
    const t = HostRegion.create(region.size);
    cleanup.push(t);
    fillRegion(t, 0xa5);
    return t;
  });
  const items = coded.map((region, i) => ({ region, path: store.blobPath(region.blob), memory: targets[i]!.memory }));
  return { store, snap, coded, targets, items };
}

/** The CPU codec in place of the GPU decoder: each chunk of the window decoded from the buffer into its region's memfd. */
function cpuDecoder(seen: { buffers: NativeHostBuffer[]; sizes: number[]; windows: number[][] }) {
  return async (buffer: NativeHostBuffer, items: readonly DeviceDecodeItem[], snapshot: string): Promise<DeviceDecodeResult> => {
    seen.buffers.push(buffer);
    seen.sizes.push(buffer.size);
    seen.windows.push(items.flatMap((x) => x.chunks.map((c) => c.held)));
    let rawBytes = 0;
    for (const x of items) {
      const fd = (x.memory as { fd: number }).fd;
      for (const c of x.chunks) {
        const raw = decodeChunk(buffer.read(c.at, c.held), c.rawSize, { chunk: c.index, region: x.region.key, snapshot });
        writeSync(fd, raw, 0, raw.length, c.index * x.region.chunkSize);
        rawBytes += raw.length;
      }
    }
    return { rawBytes, linkBytes: 0, seconds: 0, devices: [] };
  };
}

/** Replaces a published (read-only) blob with other bytes. */
function rewrite(path: string, bytes: Uint8Array): void {
  rmSync(path);
  writeFileSync(path, bytes);
}

describe('coded store blobs restored onto GPUs: the plumbing', () => {
  it('takes the GPU path only for coded blobs into GPU memory, with GPU digests, without verify all-first', async () => {
    const { snap, coded } = await captured();
    const m = snap.manifest;
    const raw = [...m.regions()].map(({ region }) => region).find((r) => !r.codec)!;
    const gpu = { kind: 'imported' as const, fd: -1, device: 0 };
    const host = { kind: 'host' as const, fd: -1 };
    expect(coded.every((r) => r.digests)).toBe(true); // a host capture takes the same GPU digests (on the CPU)
    expect(decodesOnDevice(m, coded[0]!, gpu, false)).toBe(true);
    expect(decodesOnDevice(m, coded[0]!, host, false)).toBe(false);
    expect(decodesOnDevice(m, coded[0]!, gpu, true)).toBe(false);
    expect(decodesOnDevice(m, raw, gpu, false)).toBe(false);
    const withoutDigests = Object.create(m, { regions: { value: function* () { for (const x of m.regions()) yield { ...x, region: { ...x.region, digests: null } }; } } });
    expect(decodesOnDevice(withoutDigests, coded[0]!, gpu, false)).toBe(false);
  });

  it('plans windows within the bound, every chunk once and in order, 16-byte aligned; a chunk larger than the bound alone', () => {
    const region = (sizes: number[]) => ({ size: sizes.length * 1000, chunkSize: 1000, codec: { name: 'vsnap-c1' as const, codedSizes: sizes } });
    const plan = planWindows([region([700, 300, 250]), region([1064, 10])], 1000);
    expect(plan.windows.map((w) => w.map((c) => [c.item, c.index, c.at, c.fileOffset]))).toEqual([
      [[0, 0, 0, 0]],
      [[0, 1, 0, 700], [0, 2, 304, 1000]],
      [[1, 0, 0, 0]],
      [[1, 1, 0, 1064]],
    ]);
    expect(plan.bufferBytes).toBe(1072); // the one chunk past the bound, rounded to 16
    for (const w of plan.windows) for (const c of w) expect(c.at % 16).toBe(0);
  });

  it('with directIo plans one 4 KiB-aligned read a run of a region\'s chunks, each chunk at its distance from its span\'s start; the rooms never overlap', () => {
    const region = (sizes: number[]) => ({ size: sizes.length * 100_000, chunkSize: 100_000, codec: { name: 'vsnap-c1' as const, codedSizes: sizes } });
    const regions = [region([5000, 7000, 3000]), region([9000, 100, 20000]), region([4000])];
    const plan = planWindows(regions, 32 * KiB, true);
    expect(plan.direct).toBe(true);
    expect(plan.reads.map((w) => w.map((r) => [r.item, r.fileOffset, r.length, r.at]))).toEqual([
      [[0, 0, 15000, 0], [1, 0, 9100, 16384]],
      [[1, 8192, 20908, 0], [2, 0, 4000, 24576]], // the last chunk of region 1 from the 4 KiB boundary before it
    ]);
    expect(plan.windows.map((w) => w.map((c) => [c.item, c.index, c.at]))).toEqual([
      [[0, 0, 0], [0, 1, 5000], [0, 2, 12000], [1, 0, 16384], [1, 1, 25384]],
      [[1, 2, 908], [2, 0, 24576]],
    ]);
    expect(plan.bufferBytes).toBe(28672);
    // the same invariants on a larger random layout
    const sizes = (n: number, seed: number) => Array.from({ length: n }, (_, i) => 64 + ((i * 7919 + seed * 104729) % 50_000));
    const big = [region(sizes(40, 1)), region(sizes(3, 2)), region(sizes(25, 3))];
    const wide = planWindows(big, 64 * KiB, true);
    expect(wide.windows.flat().map((c) => [c.item, c.index])).toEqual(big.flatMap((r, item) => r.codec.codedSizes.map((_, index) => [item, index])));
    wide.reads.forEach((reads, w) => {
      const room = (r: { at: number; length: number }) => r.at + Math.ceil(r.length / 4096) * 4096;
      reads.forEach((r, i) => {
        expect(r.at % 4096).toBe(0);
        expect(r.fileOffset % 4096).toBe(0);
        expect(room(r)).toBeLessThanOrEqual(i + 1 < reads.length ? reads[i + 1]!.at : wide.bufferBytes);
      });
      if (wide.windows[w]!.length > 1) expect(room(reads.at(-1)!)).toBeLessThanOrEqual(64 * KiB);
      for (const c of wide.windows[w]!) {
        const r = reads.find((x) => x.item === c.item && x.fileOffset <= c.fileOffset && c.fileOffset + c.length <= x.fileOffset + x.length)!;
        expect(c.at).toBe(r.at + c.fileOffset - r.fileOffset);
      }
    });
    expect(wide.bufferBytes).toBeLessThanOrEqual(Math.max(64 * KiB, 50_064 + 8 * KiB));
  });

  it('restores bit-exact with directIo: the windows read with O_DIRECT into 4 KiB-aligned spans', async () => {
    const { snap, coded, targets, items } = await captured();
    const windowBytes = 300 * KiB;
    const plan = planWindows(coded, windowBytes, true);
    const seen = { buffers: [] as NativeHostBuffer[], sizes: [] as number[], windows: [] as number[][] };
    const result = await decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes, directIo: true, decode: cpuDecoder(seen) });
    expect(seen.windows).toEqual(plan.windows.map((w) => w.map((c) => c.length)));
    expect(seen.sizes.every((s) => s === plan.bufferBytes)).toBe(true);
    expect(result.undecoded).toEqual([]);
    coded.forEach((r, i) => expect(targets[i]!.read(0, r.size).equals(contents[r.key]!)).toBe(true));
  });

  it('no GPU memory for a window\'s decode scratch: the windows stop there and the regions left are named for the CPU path (a VSNAP_CODEC warning)', async () => {
    const { snap, coded, items } = await captured();
    const windowBytes = 300 * KiB;
    const plan = planWindows(coded, windowBytes);
    const seen = { buffers: [] as NativeHostBuffer[], sizes: [] as number[], windows: [] as number[][] };
    const decode = cpuDecoder(seen);
    const short = 2; // the window that finds no room
    let calls = 0;
    const shortOnThird = async (buffer: NativeHostBuffer, x: readonly DeviceDecodeItem[], snapshot: string): Promise<DeviceDecodeResult> => {
      if (calls++ === short) throw new VsnapError('E_CUDA', 'cuMemAlloc (codec restore scratch) failed: CUDA_ERROR_OUT_OF_MEMORY', { cudaError: 'CUDA_ERROR_OUT_OF_MEMORY', cudaErrorNumber: 2, call: 'cuMemAlloc (codec restore scratch)' });
      return decode(buffer, x, snapshot);
    };
    const warnings: string[] = [];
    const onWarning = (w: Error & { code?: string }): void => {
      if (w.code === 'VSNAP_CODEC') warnings.push(w.message);
    };
    process.on('warning', onWarning);
    try {
      const result = await decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes, decode: shortOnThird });
      const left = [...new Set(plan.windows.slice(short).flat().map((c) => c.item))].sort();
      expect(left.length).toBeGreaterThan(0);
      expect(result.undecoded).toEqual(left);
      expect(seen.windows).toHaveLength(short); // no window after it decoded
      expect(result.rawBytes).toBe(plan.windows.slice(0, short).flat().reduce((n, c) => n + c.rawSize, 0));
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      expect(warnings.some((w) => w.includes('no GPU memory for the codec') && w.includes('decoded on the CPU'))).toBe(true);
    } finally {
      process.off('warning', onWarning);
    }
    expect(windowBuffers.heldBytes()).toBeGreaterThan(0); // given back, kept for the next restore
    // any other failure of a window's decode still fails the restore
    calls = 0;
    const otherCall = async (): Promise<DeviceDecodeResult> => {
      throw new VsnapError('E_CUDA', 'cuStreamCreate (codec restore) failed: CUDA_ERROR_OUT_OF_MEMORY', { cudaError: 'CUDA_ERROR_OUT_OF_MEMORY', call: 'cuStreamCreate (codec restore)' });
    };
    await expect(decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes, decode: otherCall })).rejects.toMatchObject({ code: 'E_CUDA' });
  });

  it('reads window by window into two alternating buffers, within the bound, kept for the next restore, and restores bit-exact', async () => {
    const { snap, coded, targets, items } = await captured();
    const windowBytes = 300 * KiB; // about one coded chunk a window
    const plan = planWindows(coded, windowBytes);
    expect(plan.windows.length).toBeGreaterThan(4);
    const seen = { buffers: [] as NativeHostBuffer[], sizes: [] as number[], windows: [] as number[][] };
    const progress: number[] = [];
    const result = await decodeStoreOnDevices(snap.manifest, items, { onProgress: (p) => progress.push(p.bytesDone) }, { windowBytes, decode: cpuDecoder(seen) });
    expect(seen.windows).toEqual(plan.windows.map((w) => w.map((c) => c.length)));
    expect(new Set(seen.buffers).size).toBe(2);
    expect(seen.sizes.every((s) => s === plan.bufferBytes)).toBe(true);
    seen.buffers.forEach((b, i) => expect(b).toBe(seen.buffers[i % 2]));
    // kept for the next restore (pinning stays off the restore path), freed when idle
    expect(seen.buffers[0]!.closed).toBe(false);
    expect(windowBuffers.heldBytes()).toBe(2 * plan.bufferBytes);
    const again = { buffers: [] as NativeHostBuffer[], sizes: [] as number[], windows: [] as number[][] };
    await decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes, decode: cpuDecoder(again) });
    expect(new Set(again.buffers)).toEqual(new Set(seen.buffers));
    windowBuffers.releaseIdle();
    expect(seen.buffers.every((b) => b.closed)).toBe(true);
    expect(windowBuffers.heldBytes()).toBe(0);
    expect(plan.bufferBytes).toBeLessThanOrEqual(Math.max(windowBytes, ...coded.flatMap((r) => r.codec!.codedSizes.map((s) => Math.ceil(s / 16) * 16))));
    expect(result.rawBytes).toBe(coded.reduce((n, r) => n + r.size, 0));
    expect(progress.at(-1)).toBe(result.rawBytes);
    coded.forEach((r, i) => expect(targets[i]!.read(0, r.size).equals(contents[r.key]!)).toBe(true));
  });

  it('a damaged header in the last window, a missing or a short blob refuse naming region (and chunk) before any window is decoded', async () => {
    const { snap, coded, targets, items, store } = await captured();
    const last = coded.at(-1)!;
    const path = store.blobPath(last.blob);
    const good = readFileSync(path);
    const damaged = Buffer.from(good);
    const chunk = last.codec!.codedSizes.length - 1;
    damaged[codedOffsets(last.codec!)[chunk]!] = 0x58; // its magic
    rewrite(path, damaged);
    const seen = { buffers: [] as NativeHostBuffer[], sizes: [] as number[], windows: [] as number[][] };
    const err = await decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes: 300 * KiB, decode: cpuDecoder(seen) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).code).toBe('E_CODEC_CORRUPT');
    expect((err as VsnapError).details).toMatchObject({ region: last.key, chunk, snapshot: 'm' });
    expect(seen.windows).toEqual([]);
    for (const t of targets) expect(allBytes(t, 0xa5)).toBe(true);

    rmSync(path);
    await expect(decodeStoreOnDevices(snap.manifest, items, {}, { decode: cpuDecoder(seen) })).rejects.toMatchObject({ code: 'E_BLOB_MISSING', details: { region: last.key } });

    writeFileSync(path, good.subarray(0, good.length - 10)); // truncated inside its last chunk
    const short = await decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes: 300 * KiB, decode: cpuDecoder(seen) }).catch((e: unknown) => e);
    expect((short as VsnapError).code).toBe('E_BLOB_TRUNCATED');
    expect((short as VsnapError).details).toMatchObject({ region: last.key, chunk });
    expect(seen.windows).toEqual([]);
    for (const t of targets) expect(allBytes(t, 0xa5)).toBe(true);
  });

  it('a decode that fails stops the restore: the window being read is awaited and the buffers given back', async () => {
    const { snap, items } = await captured();
    const buffers: NativeHostBuffer[] = [];
    const failing = async (buffer: NativeHostBuffer): Promise<DeviceDecodeResult> => {
      buffers.push(buffer);
      throw new VsnapError('E_CODEC_CORRUPT', 'found by the decoder', { reason: 'test' });
    };
    await expect(decodeStoreOnDevices(snap.manifest, items, {}, { windowBytes: 300 * KiB, decode: failing })).rejects.toMatchObject({ code: 'E_CODEC_CORRUPT' });
    expect(buffers).toHaveLength(1);
    expect(windowBuffers.heldBytes()).toBeGreaterThan(0); // given back once the window being read landed
    windowBuffers.releaseIdle();
    expect(buffers[0]!.closed).toBe(true);
  });

  it('a cancel stops between windows (E_ABORTED): the windows after it are not decoded', async () => {
    const { snap, items } = await captured();
    const controller = new AbortController();
    const seen = { buffers: [] as NativeHostBuffer[], sizes: [] as number[], windows: [] as number[][] };
    const decode = cpuDecoder(seen);
    const cancelling = async (buffer: NativeHostBuffer, x: readonly DeviceDecodeItem[], snapshot: string): Promise<DeviceDecodeResult> => {
      controller.abort();
      return decode(buffer, x, snapshot);
    };
    await expect(decodeStoreOnDevices(snap.manifest, items, { signal: controller.signal }, { windowBytes: 300 * KiB, decode: cancelling })).rejects.toMatchObject({ code: 'E_ABORTED' });
    expect(seen.windows).toHaveLength(1);
  });
});

describe('readFilesInto: byte ranges of files into a HostBuffer', () => {
  it('reads ranges at any offset (pieces over threads) where asked, and refuses a missing, a resized file or a range outside the buffer', async () => {
    const dir = tempDir();
    const a = randomChunk(20 * 1024 * KiB + 3, 21); // three 8 MiB pieces, the last short
    const b = randomChunk(5000, 22);
    writeFileSync(`${dir}/a`, a);
    writeFileSync(`${dir}/b`, b);
    const buffer = await native().createHostBuffer(32 * 1024 * KiB, -1);
    cleanup.push(buffer);
    const reads = (...xs: number[]) => new Float64Array(xs);
    const r = await native().readFilesInto(
      { kind: 'buffer', buffer, offset: 16 },
      [
        { path: `${dir}/a`, size: a.length, reads: reads(7, a.length - 7, 0) },
        { path: `${dir}/b`, size: b.length, reads: reads(100, 50, a.length + 9, 0, 10, a.length + 200) },
      ],
      3,
    );
    expect(r.bytes).toBe(a.length - 7 + 60);
    expect(buffer.read(16, a.length - 7).equals(a.subarray(7))).toBe(true);
    expect(buffer.read(16 + a.length + 9, 50).equals(b.subarray(100, 150))).toBe(true);
    expect(buffer.read(16 + a.length + 200, 10).equals(b.subarray(0, 10))).toBe(true);

    await expect(native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, [{ path: `${dir}/gone`, size: 1, reads: reads(0, 1, 0) }], 2)).rejects.toMatchObject({ code: 'E_BLOB_MISSING' });
    await expect(native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, [{ path: `${dir}/b`, size: b.length + 1, reads: reads(0, 1, 0) }], 2)).rejects.toMatchObject({ code: 'E_BLOB_TRUNCATED' });
    expect(() => native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, [{ path: `${dir}/b`, size: b.length, reads: reads(0, 10, buffer.size - 5) }], 2)).toThrow(/outside the HostBuffer/);
  });

  it('direct: reads 4 KiB-aligned ranges (one ending at the file\'s end), and refuses unaligned ones or a rounded-up room past the buffer', async () => {
    const dir = tempDir();
    const a = randomChunk(9 * 1024 * KiB + 1234, 23); // two 8 MiB pieces, the last short and ending inside a 4 KiB page
    writeFileSync(`${dir}/a`, a);
    const buffer = await native().createHostBuffer(12 * 1024 * KiB, -1);
    cleanup.push(buffer);
    const reads = (...xs: number[]) => new Float64Array(xs);
    const file = (r: Float64Array) => [{ path: `${dir}/a`, size: a.length, reads: r }];
    const r = await native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, file(reads(4096, a.length - 4096, 8192, 0, 100, 0)), 3, true);
    expect(r.bytes).toBe(a.length - 4096 + 100);
    expect(buffer.read(8192, a.length - 4096).equals(a.subarray(4096))).toBe(true);
    expect(buffer.read(0, 100).equals(a.subarray(0, 100))).toBe(true);
    expect(() => native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, file(reads(100, 10, 0)), 2, true)).toThrow(/4 KiB aligned/);
    expect(() => native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, file(reads(0, 10, 16)), 2, true)).toThrow(/4 KiB aligned/);
    expect(() => native().readFilesInto({ kind: 'buffer', buffer, offset: 16 }, file(reads(0, 10, 0)), 2, true)).toThrow(/4 KiB aligned/);
    expect(() => native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, file(reads(0, 10, buffer.size - 4096 + 4080)), 2, true)).toThrow(/outside the HostBuffer|4 KiB aligned/);
    expect(() => native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, file(reads(0, 4097, buffer.size - 4096)), 2, true)).toThrow(/outside the HostBuffer/);
    // buffered, the same unaligned range reads
    await native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, file(reads(100, 10, 16)), 2);
    expect(buffer.read(16, 10).equals(a.subarray(100, 110))).toBe(true);
  });
});

describe('windowBuffers: the window buffers kept between restores', () => {
  it('lends the kept set to one restore at a time, makes a larger one where needed, and keeps one set', async () => {
    windowBuffers.releaseIdle(); // a set kept by an earlier test must not be the one lent first
    // each lease's set by name, and the second lease starts only once the first holds its set:
    // the order in which the two sets are made must not decide what the test sees
    let firstSet: NativeHostBuffer[] = [];
    let secondSet: NativeHostBuffer[] = [];
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let holding!: () => void;
    const lentFirst = new Promise<void>((r) => (holding = r));
    const first = windowBuffers.lease(64 * KiB, 2, -1, async (b) => {
      firstSet = [...b];
      holding();
      await held;
    });
    await lentFirst;
    await windowBuffers.lease(32 * KiB, 2, -1, async (b) => {
      secondSet = [...b]; // the first still holds its set: this one makes its own
    });
    release();
    await first;
    expect(firstSet[0]).not.toBe(secondSet[0]);
    expect(windowBuffers.heldBytes()).toBe(2 * 64 * KiB); // the larger set kept, the other freed
    expect(secondSet.every((b) => b.closed)).toBe(true);
    await windowBuffers.lease(16 * KiB, 1, -1, async (b) => {
      expect(b).toEqual([firstSet[0]]); // a smaller need takes the kept set
    });
    await windowBuffers.lease(128 * KiB, 2, -1, async (b) => {
      expect(b[0]!.size).toBe(128 * KiB); // a larger need replaces it
    });
    expect(firstSet.every((b) => b.closed)).toBe(true);
    windowBuffers.releaseIdle();
    expect(windowBuffers.heldBytes()).toBe(0);
  });
});
