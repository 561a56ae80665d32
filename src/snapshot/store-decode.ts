import { open, type FileHandle } from 'node:fs/promises';

import { abortError, toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import { native, type NativeHostBuffer } from '../native/index.js';
import { memoryDevice, type RegionMemory } from '../regions/memory.js';
import { codedOffsets, storedBytes } from '../store/coded-blob.js';
import { inspectChunk } from '../transfer/codec.js';
import { defaultThreads } from '../transfer/staging.js';
import { windowBuffers } from '../transfer/window-buffers.js';
import type { TransferOptions } from '../transfer/transfer.js';
import { decodeOnDevices, onDevice, restoreScratchShortage, warnDecodedOnCpu, type DeviceDecodeItem, type DeviceDecodeResult } from './device-decode.js';

/*
 * A restore of coded store blobs into GPU memory, decoded on the GPU (docs/compression.md): the
 * coded chunks are read from disk a window at a time into pinned memory, and each window is
 * decoded by the RAM tier's GPU path (decodeOnDevices) while the next one is read.
 */

/** Coded bytes of one window (a window holds at least one whole chunk): two windows are pinned. @internal */
export const STORE_WINDOW_BYTES = 256 * 1024 * 1024;

/** Coded chunks start 16-byte aligned in a window read through the page cache, as the RAM tier holds them. */
const ALIGN = 16;

/** O_DIRECT reads start at a multiple of this in the file and in the buffer, and write whole units of it. */
const DIRECT_ALIGN = 4096;

/** A coded region to restore onto its GPU: its blob and its target. @internal */
export interface StoreDecodeItem {
  readonly region: RegionInfo;
  readonly path: string;
  readonly memory: RegionMemory;
}

/** One coded chunk of a window: where it lies in its blob, and where in the window. @internal */
export interface WindowChunk {
  /** Index of its item. */
  readonly item: number;
  /** Its index in the region. */
  readonly index: number;
  readonly fileOffset: number;
  /** Its coded size. */
  readonly length: number;
  readonly rawSize: number;
  /** Offset in the window's buffer. */
  readonly at: number;
}

/** One read of a window: `length` bytes of its item's blob from `fileOffset`, into the buffer at `at`. @internal */
export interface WindowRead {
  readonly item: number;
  readonly fileOffset: number;
  readonly length: number;
  readonly at: number;
}

/** The windows of a restore, their reads, and the buffer each needs. @internal */
export interface WindowPlan {
  readonly windows: readonly (readonly WindowChunk[])[];
  /** Per window, the reads that fill it: one a chunk, or with `direct` one a run of a region's chunks. */
  readonly reads: readonly (readonly WindowRead[])[];
  /**
   * The largest window's end: at most max(windowBytes, the largest coded chunk rounded up to 16),
   * with `direct` max(windowBytes, the largest coded chunk + 8 KiB).
   */
  readonly bufferBytes: number;
  /** Whether the reads are O_DIRECT's (4 KiB aligned spans). */
  readonly direct: boolean;
}

const roundUp = (n: number, to: number): number => Math.ceil(n / to) * to;

/**
 * Whether a region's coded blob is decoded on the GPU when restored from the store into `memory`:
 * GPU memory, a coded blob, the snapshot's GPU digests to check the decoded bytes against (every
 * region has them: the restore's digest covers all or none), and no `verify: 'all-first'` (which
 * checks every chunk's checksum before the first byte is written: on the CPU).
 * @internal
 */
export function decodesOnDevice(manifest: Manifest, region: RegionInfo, memory: RegionMemory, verifyFirst: boolean): boolean {
  if (!region.codec || verifyFirst || !onDevice(memory)) return false;
  for (const { region: r } of manifest.regions()) if (!r.digests) return false;
  return true;
}

/**
 * Lays the coded chunks of `regions` out in windows of at most `windowBytes` (a chunk larger than
 * that alone in its own), in order. Read through the page cache, each chunk is one read and starts
 * 16-byte aligned. With `direct` (O_DIRECT), a window's chunks of one region (back to back in its
 * blob) are one read of the 4 KiB-aligned span around them, placed 4 KiB aligned, so a chunk lies
 * at its span's place plus its distance from the span's start (any alignment: the GPU decode
 * copies each chunk into an aligned device slot first); each span's room is rounded up to 4 KiB.
 * @internal
 */
export function planWindows(regions: readonly Pick<RegionInfo, 'size' | 'chunkSize' | 'codec'>[], windowBytes: number, direct = false): WindowPlan {
  const windows: WindowChunk[][] = [];
  const reads: WindowRead[][] = [];
  let chunks: WindowChunk[] = [];
  let spans: WindowRead[] = [];
  let cursor = 0; // the end of the window's room so far
  let bufferBytes = 0;
  const close = (): void => {
    windows.push(chunks);
    reads.push(spans);
    chunks = [];
    spans = [];
    cursor = 0;
  };
  // Where a chunk goes in the current window: its read (a new one, or the run it extends) and the room's new end.
  const place = (item: number, fileOffset: number, length: number): { read: WindowRead; replaces: boolean; end: number } => {
    const last = spans.at(-1);
    if (direct && last && last.item === item && last.fileOffset + last.length === fileOffset) {
      const read = { ...last, length: last.length + length };
      return { read, replaces: true, end: read.at + roundUp(read.length, DIRECT_ALIGN) };
    }
    if (direct) {
      const start = fileOffset - (fileOffset % DIRECT_ALIGN);
      const read = { item, fileOffset: start, length: fileOffset + length - start, at: cursor };
      return { read, replaces: false, end: read.at + roundUp(read.length, DIRECT_ALIGN) };
    }
    return { read: { item, fileOffset, length, at: cursor }, replaces: false, end: roundUp(cursor + length, ALIGN) };
  };
  regions.forEach((region, item) => {
    const offsets = codedOffsets(region.codec!);
    region.codec!.codedSizes.forEach((length, index) => {
      const fileOffset = offsets[index]!;
      let spot = place(item, fileOffset, length);
      if (chunks.length > 0 && spot.end > windowBytes) {
        close();
        spot = place(item, fileOffset, length);
      }
      if (spot.replaces) spans[spans.length - 1] = spot.read;
      else spans.push(spot.read);
      const rawSize = Math.min(region.chunkSize, region.size - index * region.chunkSize);
      chunks.push({ item, index, fileOffset, length, rawSize, at: spot.read.at + (fileOffset - spot.read.fileOffset) });
      cursor = spot.end;
      bufferBytes = Math.max(bufferBytes, cursor);
    });
  });
  if (chunks.length > 0) close();
  return { windows, reads, bufferBytes, direct };
}

/** The bytes of a coded chunk its header check reads: header, symbol table and block table (they come first). */
function checkedPrefix(length: number, rawSize: number): number {
  return Math.min(length, 64 + 256 + ALIGN + 4 * Math.ceil(rawSize / 4096) + ALIGN);
}

async function readExactly(file: FileHandle, into: Uint8Array, position: number, region: string, chunk: number, snapshot: string): Promise<void> {
  let done = 0;
  while (done < into.length) {
    const { bytesRead } = await file.read(into, done, into.length - done, position + done);
    if (bytesRead === 0) {
      throw new VsnapError('E_BLOB_TRUNCATED', `the blob of region ${region} in snapshot ${snapshot} ends inside chunk ${chunk}: restore from another copy or capture again`, { region, chunk, snapshot });
    }
    done += bytesRead;
  }
}

/**
 * Every coded chunk's header and tables checked (as a decode checks them) before anything is
 * written: E_CODEC_CORRUPT naming region and chunk, E_BLOB_TRUNCATED for a short blob. Reads
 * only the chunks' first bytes (the header check reads nothing past its block table).
 */
async function checkHeaders(items: readonly StoreDecodeItem[], files: readonly FileHandle[], snapshot: string): Promise<void> {
  let largest = 0;
  for (const { region } of items) for (const s of region.codec!.codedSizes) largest = Math.max(largest, s);
  // Only the prefix of this buffer is ever written or read: its other pages are never touched.
  const scratch = Buffer.allocUnsafeSlow(largest);
  for (const [i, { region }] of items.entries()) {
    const { size } = await files[i]!.stat();
    const offsets = codedOffsets(region.codec!);
    if (size < storedBytes(region)) {
      const chunk = offsets.findIndex((o) => o > size) - 1;
      throw new VsnapError('E_BLOB_TRUNCATED', `the blob of region ${region.key} in snapshot ${snapshot} ends inside chunk ${chunk}: restore from another copy or capture again`, { region: region.key, chunk, snapshot });
    }
    if (size > storedBytes(region)) {
      throw new VsnapError('E_BLOB_TRUNCATED', `the blob of region ${region.key} in snapshot ${snapshot} holds ${size} bytes, its coded chunks ${storedBytes(region)}: restore from another copy or capture again`, { region: region.key, snapshot });
    }
    for (const [index, length] of region.codec!.codedSizes.entries()) {
      const rawSize = Math.min(region.chunkSize, region.size - index * region.chunkSize);
      await readExactly(files[i]!, scratch.subarray(0, checkedPrefix(length, rawSize)), offsets[index]!, region.key, index, snapshot);
      inspectChunk(scratch.subarray(0, length), rawSize, { chunk: index, region: region.key, snapshot });
    }
  }
}

/** A blob opened for reading; one that is gone is E_BLOB_MISSING, as the transfer engine says it. */
async function openBlob(item: StoreDecodeItem, snapshot: string): Promise<FileHandle> {
  try {
    return await open(item.path, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw toVsnapError(err);
    throw new VsnapError('E_BLOB_MISSING', `blob '${item.path}' of region ${item.region.key} in snapshot ${snapshot} does not exist: the store lost it; run \`vsnap verify\` and recapture`, {
      path: item.path,
      region: item.region.key,
      snapshot,
    });
  }
}

/**
 * Fills `buffer` with a window's coded chunks, read from their blobs by the addon (pread, 8 MiB
 * pieces over `threads` threads, straight into the buffer; O_DIRECT where the plan is `direct`).
 */
async function fillWindow(buffer: NativeHostBuffer, reads: readonly WindowRead[], items: readonly StoreDecodeItem[], threads: number, direct: boolean): Promise<void> {
  const byItem = new Map<number, WindowRead[]>();
  for (const r of reads) {
    const list = byItem.get(r.item);
    if (list) list.push(r);
    else byItem.set(r.item, [r]);
  }
  const files = [...byItem].map(([item, list]) => {
    const spans = new Float64Array(list.length * 3);
    list.forEach((r, k) => spans.set([r.fileOffset, r.length, r.at], k * 3));
    return { path: items[item]!.path, size: storedBytes(items[item]!.region), reads: spans };
  });
  try {
    await native().readFilesInto({ kind: 'buffer', buffer, offset: 0 }, files, threads, direct);
  } catch (err) {
    throw toVsnapError(err);
  }
}

/** Options of {@link decodeStoreOnDevices}. @internal */
export interface StoreDecodeOptions {
  /** Coded bytes a window (default {@link STORE_WINDOW_BYTES}). */
  readonly windowBytes?: number;
  /** Read the windows with O_DIRECT (RestoreOptions.directIo; buffered where the file system refuses it). */
  readonly directIo?: boolean;
  /** The decode of a window (default: on the GPUs, {@link decodeOnDevices}); tests decode on the CPU. */
  readonly decode?: (buffer: NativeHostBuffer, items: readonly DeviceDecodeItem[], snapshot: string) => Promise<DeviceDecodeResult>;
}

/** What {@link decodeStoreOnDevices} did. @internal */
export interface StoreDecodeResult extends DeviceDecodeResult {
  /**
   * Indices (in its items) of the regions not restored, for want of GPU memory for the decode's
   * scratch: every region with a chunk in the window that found no room or a later one (a region
   * begun in an earlier window included). The caller restores them on the CPU, whole. Empty when
   * every window was decoded on the GPUs.
   */
  readonly undecoded: readonly number[];
}

/**
 * Restores coded store blobs onto their GPUs: every chunk's header checked first (a damaged one
 * refuses naming region and chunk before anything is written), then window by window: a window's
 * coded chunks read from disk into one of two pinned buffers while the previous window is decoded
 * on the GPUs from the other. Host memory held: the two pinned buffers, of
 * {@link WindowPlan.bufferBytes} each (2 x 256 MiB at most by default), kept for the next restore
 * until idle (windowBuffers). The decoded bytes are not
 * checked here: the caller compares them with the snapshot's GPU digests before any wake. A window
 * whose decode finds no GPU memory for its scratch (made per window, before anything of the window
 * is issued) stops the windows: the regions left are named in `undecoded` (a `VSNAP_CODEC` warning).
 * @internal
 */
export async function decodeStoreOnDevices(
  manifest: Manifest,
  items: readonly StoreDecodeItem[],
  common: Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>,
  options: StoreDecodeOptions = {},
): Promise<StoreDecodeResult> {
  if (items.length === 0) return { rawBytes: 0, linkBytes: 0, seconds: 0, devices: [], undecoded: [] };
  const started = performance.now();
  const decode = options.decode ?? decodeOnDevices;
  const plan = planWindows(items.map((x) => x.region), options.windowBytes ?? STORE_WINDOW_BYTES, options.directIo ?? false);
  const totalRaw = items.reduce((n, x) => n + x.region.size, 0);
  const files: FileHandle[] = [];
  try {
    for (const x of items) files.push(await openBlob(x, manifest.name));
    await checkHeaders(items, files, manifest.name);
  } finally {
    for (const f of files) await f.close();
  }
  if (common.signal?.aborted) throw abortError(common.signal, `restore of '${manifest.name}'`);
  // Pinned (portable) where the targets are GPU memory: the GPU of the first whose GPU is known, else GPU 0.
  const pinDevice = items.some((x) => onDevice(x.memory)) ? (items.map((x) => memoryDevice(x.memory)).find((d) => d !== undefined) ?? 0) : -1;
  const threads = common.threads ?? defaultThreads();
  return windowBuffers.lease(plan.bufferBytes, Math.min(2, plan.windows.length), pinDevice, async (buffers) => {
    const fill = (w: number): Promise<void> => fillWindow(buffers[w % 2]!, plan.reads[w]!, items, threads, plan.direct);
    let rawBytes = 0;
    let linkBytes = 0;
    const byDevice = new Map<number, number>();
    const undecoded = new Set<number>();
    let filling: Promise<void> | undefined = fill(0);
    try {
      for (let w = 0; w < plan.windows.length; w++) {
        await filling;
        filling = undefined;
        if (common.signal?.aborted) throw abortError(common.signal, `restore of '${manifest.name}'`);
        const decoding = decode(buffers[w % 2]!, windowItems(items, plan.windows[w]!), manifest.name);
        if (w + 1 < plan.windows.length) {
          filling = fill(w + 1);
          filling.catch(() => undefined); // awaited on every path
        }
        let done: DeviceDecodeResult;
        try {
          done = await decoding;
        } catch (err) {
          if (!restoreScratchShortage(err)) throw err;
          for (const c of plan.windows.slice(w).flat()) undecoded.add(c.item);
          warnDecodedOnCpu(manifest.name, `${undecoded.size} of its ${items.length} coded region(s) from the store`, err);
          break;
        }
        rawBytes += done.rawBytes;
        linkBytes += done.linkBytes;
        for (const d of done.devices) byDevice.set(d.device, (byDevice.get(d.device) ?? 0) + d.bytes);
        common.onProgress?.({ phase: 'copying', bytesDone: rawBytes, bytesTotal: totalRaw });
      }
    } finally {
      await filling?.catch(() => undefined); // nothing fills a buffer once it is lent again
    }
    const seconds = (performance.now() - started) / 1000;
    if (undecoded.size === 0) common.onProgress?.({ phase: 'done', bytesDone: rawBytes, bytesTotal: totalRaw }); // else the CPU path's copy goes on
    return { rawBytes, linkBytes, seconds, devices: [...byDevice].map(([device, b]) => ({ device, bytes: b, seconds })), undecoded: [...undecoded].sort((a, b) => a - b) };
  });
}

/** A window's chunks as decode items, one a region. */
function windowItems(items: readonly StoreDecodeItem[], window: readonly WindowChunk[]): DeviceDecodeItem[] {
  const byItem = new Map<number, DeviceDecodeItem & { chunks: Array<DeviceDecodeItem['chunks'][number]> }>();
  for (const c of window) {
    let entry = byItem.get(c.item);
    if (!entry) {
      entry = { region: items[c.item]!.region, memory: items[c.item]!.memory, chunks: [] };
      byItem.set(c.item, entry);
    }
    entry.chunks.push({ index: c.index, at: c.at, held: c.length, rawSize: c.rawSize, coded: true });
  }
  return [...byItem.values()];
}
