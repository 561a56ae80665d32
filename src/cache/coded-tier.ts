import { toVsnapError } from '../errors.js';
import type { RegionInfo, TensorInfo } from '../manifest/types.js';
import { native, type NativeHostBuffer } from '../native/index.js';
import { HostRegion } from '../regions/host-region.js';
import { memoryDevice, toNativeMemory, type RegionMemory } from '../regions/memory.js';
import { readBlobChunk, readStoredChunk } from '../store/coded-blob.js';
import type { RegionStore } from '../store/region-store.js';
import { codecKindForDtype, codecKindNumber, decodeChunkOffThread, encodeChunkOffThread, type CodecKind } from '../transfer/codec.js';
import { deviceContexts } from '../transfer/contexts.js';
import { codecConcurrency, inOrder } from '../transfer/in-order.js';
import { DEFAULT_CHUNK_SIZE } from '../transfer/staging.js';
import { runTransfer } from '../transfer/transfer.js';

/**
 * Where one chunk of a region lies in the RAM tier: `coded` (a vsnap-c1 chunk that shrank) or the
 * raw bytes as they are (a chunk that did not shrink keeps no header here).
 * @internal
 */
export interface HeldChunk {
  /** Offset in the RAM tier's buffer. */
  readonly at: number;
  /** Bytes held. */
  readonly held: number;
  /** The chunk's decoded size. */
  readonly rawSize: number;
  /** Whether the bytes held are a coded chunk (else the raw bytes). */
  readonly coded: boolean;
}

/** A region of a RAM-tier entry to code: where its raw bytes lie now, and its manifest entry. @internal */
export interface CodeItem {
  readonly id: string;
  readonly offset: number;
  readonly region: RegionInfo;
}

/** Coded chunks start 16-byte aligned (what a GPU decode of them needs). */
const ALIGN = 16;

/** The dtype hint of a region: that of its largest tensor, `bytes` where none is known. */
export function regionHint(region: Pick<RegionInfo, 'size'> & { readonly tensors?: readonly TensorInfo[] }): CodecKind {
  let best: { bytes: number; dtype: string } | undefined;
  const sorted = [...(region.tensors ?? [])].sort((a, b) => a.offset - b.offset);
  sorted.forEach((t, i) => {
    const end = sorted[i + 1]?.offset ?? region.size;
    if (!best || end - t.offset > best.bytes) best = { bytes: end - t.offset, dtype: t.dtype };
  });
  return codecKindForDtype(best?.dtype);
}

/**
 * Writes `data` into the RAM tier's buffer at `offset` (through a memfd and the transfer engine:
 * the buffer has no writer of its own on the JS side).
 * @internal
 */
export async function writeHostBuffer(buffer: NativeHostBuffer, offset: number, data: Uint8Array): Promise<void> {
  if (data.byteLength === 0) return;
  const tmp = HostRegion.create(data.byteLength, 'vsnap-coded');
  try {
    tmp.write(0, data);
    await runTransfer({
      op: 'capture',
      label: 'ram-tier coding',
      hash: false,
      regions: [{ name: 'coded', size: data.byteLength, chunkSize: DEFAULT_CHUNK_SIZE, memory: tmp.memory, hostCopy: { kind: 'buffer', buffer, offset } }],
    });
  } finally {
    tmp.close();
  }
}

/** A region's chunks. */
const chunkCount = (region: Pick<RegionInfo, 'size' | 'chunkSize'>): number => Math.ceil(region.size / region.chunkSize);

/** Appends one chunk's held bytes to a region's parts, 16-byte aligned from `cursor`; returns the next cursor. */
function pack(parts: Buffer[], held: HeldChunk[], cursor: number, bytes: Buffer, rawSize: number, coded: boolean): number {
  const pad = (ALIGN - (bytes.length % ALIGN)) % ALIGN;
  held.push({ at: cursor, held: bytes.length, rawSize, coded });
  parts.push(bytes, Buffer.alloc(pad));
  return cursor + bytes.length + pad;
}

/**
 * Codes an entry's regions in place (CPU codec): every chunk that shrinks is replaced by its coded
 * form, the others kept raw, all packed from `base` on. Returns each region's chunks and the bytes
 * the entry now takes. Regions must be in ascending `offset` order, each at or after `base`, laid
 * out back to back (4096-aligned): one region is in JS memory at a time.
 * @internal
 */
export async function codeInPlace(buffer: NativeHostBuffer, base: number, items: readonly CodeItem[]): Promise<{ chunks: Map<string, HeldChunk[]>; bytes: number }> {
  const chunks = new Map<string, HeldChunk[]>();
  let cursor = base;
  for (const { id, offset, region } of items) {
    const hint = regionHint(region);
    const held: HeldChunk[] = [];
    const parts: Buffer[] = [];
    const start = cursor;
    const code = async (k: number): Promise<{ raw: Buffer; coded: Buffer }> => {
      const raw = buffer.read(offset + k * region.chunkSize, Math.min(region.chunkSize, region.size - k * region.chunkSize));
      return { raw, coded: await encodeChunkOffThread(raw, hint) };
    };
    await inOrder(chunkCount(region), codecConcurrency(), code, ({ raw, coded }) => {
      const shrank = coded.length < raw.length;
      cursor = pack(parts, held, cursor, shrank ? coded : raw, raw.length, shrank);
    });
    chunks.set(id, held);
    try {
      // Packed bytes never run past their region's raw bytes (already read): the next region is intact.
      await writeHostBuffer(buffer, start, Buffer.concat(parts));
    } catch (err) {
      throw toVsnapError(err);
    }
  }
  return { chunks, bytes: cursor - base };
}

/** A region of a capture to land coded on its GPU. @internal */
export interface CodedSource {
  readonly id: string;
  readonly size: number;
  readonly chunkSize: number;
  readonly memory: RegionMemory;
  readonly tensors?: readonly TensorInfo[];
}

/** Whether a region is GPU memory (a capture from it can be coded on its GPU). @internal */
export function onDevice(memory: RegionMemory): boolean {
  return memoryDevice(memory) !== undefined;
}

/**
 * Whether a coded capture failed for want of GPU memory for its scratch (before anything was
 * issued: the room reserved is untouched, and the capture can land raw instead). @internal
 */
export function scratchShortage(err: unknown): boolean {
  const e = toVsnapError(err);
  return e.code === 'E_CUDA' && e.details.cudaError === 'CUDA_ERROR_OUT_OF_MEMORY' && e.details.call === 'cuMemAlloc (codec capture scratch)';
}

/**
 * Lands a capture coded on the GPU (native/codec/codec_capture.h): each chunk encoded on its GPU
 * into one of two device scratch slots while the previous chunk's coded bytes (the raw bytes where
 * it did not shrink) cross into `buffer`, packed 16-byte aligned from `base`, never past `limit`.
 * The same bytes as {@link codeInPlace} would hold. Returns each region's chunks, the bytes the
 * entry takes, and the bytes that crossed the link.
 * @internal
 */
export async function captureCoded(
  buffer: NativeHostBuffer,
  base: number,
  limit: number,
  sources: readonly CodedSource[],
): Promise<{ chunks: Map<string, HeldChunk[]>; bytes: number; linkBytes: number; seconds: number }> {
  const devices = sources.map((s) => memoryDevice(s.memory));
  const specs = sources.map((s) => ({ memory: toNativeMemory(s.memory), size: s.size, chunkSize: s.chunkSize, kind: codecKindNumber(regionHint(s)) }));
  try {
    const r = await deviceContexts.use(devices, () => native().codecCaptureHeld({ kind: 'buffer', buffer, offset: base }, limit, specs));
    const chunks = new Map<string, HeldChunk[]>();
    sources.forEach((s, t) => {
      const f = r.chunks[t]!;
      const held: HeldChunk[] = [];
      for (let k = 0; k < f.length; k += 4) held.push({ at: f[k]!, held: f[k + 1]!, rawSize: f[k + 2]!, coded: f[k + 3] === 1 });
      chunks.set(s.id, held);
    });
    return { chunks, bytes: r.end - base, linkBytes: r.linkBytes, seconds: r.seconds };
  } catch (err) {
    throw toVsnapError(err);
  }
}

/**
 * Decodes a region held coded in the RAM tier into a memfd, chunk by chunk; a damaged chunk throws
 * E_CODEC_CORRUPT naming it before anything is written to a target. The caller closes the memfd.
 * @internal
 */
export async function decodeHeld(buffer: NativeHostBuffer, region: RegionInfo, held: readonly HeldChunk[], snapshot: string): Promise<HostRegion> {
  const out = HostRegion.create(region.size, 'vsnap-decoded');
  try {
    const decode = async (i: number): Promise<Buffer> => {
      const c = held[i]!;
      const bytes = buffer.read(c.at, c.held);
      return c.coded ? await decodeChunkOffThread(bytes, c.rawSize, { chunk: i, region: region.key, snapshot }) : bytes;
    };
    await inOrder(held.length, codecConcurrency(), decode, (raw, i) => out.write(i * region.chunkSize, raw));
    return out;
  } catch (err) {
    out.close();
    throw err;
  }
}

/**
 * Loads regions whose store blobs are coded (`RegionInfo.codec`) into the RAM tier, each at its
 * raw-layout `offset`: every chunk read, decoded and checked against its checksum on the CPU (the
 * RAM tier holds only verified bytes), then written raw. Regions with raw blobs are read and checked
 * the same way. The caller codes the entry afterwards where the cache codes.
 * @internal
 */
export async function loadDecoded(store: RegionStore, buffer: NativeHostBuffer, items: readonly CodeItem[], snapshot: string): Promise<void> {
  for (const { offset, region } of items) {
    const parts: Buffer[] = [];
    const chunks = Math.ceil(region.size / region.chunkSize);
    for (let i = 0; i < chunks; i++) parts.push(await readBlobChunk(store.blobPath(region.blob), region, i, snapshot));
    await writeHostBuffer(buffer, offset, Buffer.concat(parts));
  }
}

/**
 * Loads a snapshot with coded store blobs into a RAM tier that codes, packed 16-byte aligned from
 * `base` as {@link codeInPlace} packs: a coded blob's chunks are held as the store has them (the
 * same vsnap-c1 chunks the tier holds), each decoded once and checked against its checksum first,
 * never encoded again; a chunk the blob stores raw (mode raw, or not smaller than its raw bytes) is
 * held as its raw bytes. A region with a raw blob is read, checked and coded on the CPU. Nothing is
 * written until a region's every chunk passed (a damaged one throws naming region and chunk).
 * Returns each region's chunks and the bytes the entry takes (at most its raw layout's).
 * @internal
 */
export async function loadCoded(store: RegionStore, buffer: NativeHostBuffer, base: number, items: readonly CodeItem[], snapshot: string): Promise<{ chunks: Map<string, HeldChunk[]>; bytes: number }> {
  const chunks = new Map<string, HeldChunk[]>();
  let cursor = base;
  for (const { id, region } of items) {
    const path = store.blobPath(region.blob);
    const hint = regionHint(region);
    const held: HeldChunk[] = [];
    const parts: Buffer[] = [];
    const start = cursor;
    const read = async (i: number): Promise<{ raw: Buffer; coded: Buffer | undefined }> => {
      const { stored, raw } = await readStoredChunk(path, region, i, snapshot);
      // decoded, so its header is sound; shorter than its raw bytes, so it is no raw-mode chunk (header + bytes)
      if (region.codec) return { raw, coded: stored.length < raw.length ? stored : undefined };
      const c = await encodeChunkOffThread(raw, hint);
      return { raw, coded: c.length < raw.length ? c : undefined };
    };
    await inOrder(chunkCount(region), codecConcurrency(), read, ({ raw, coded }) => {
      cursor = pack(parts, held, cursor, coded ?? raw, raw.length, coded !== undefined);
    });
    chunks.set(id, held);
    await writeHostBuffer(buffer, start, Buffer.concat(parts));
  }
  return { chunks, bytes: cursor - base };
}
