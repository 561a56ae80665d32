import { open, rename, rm } from 'node:fs/promises';

import { VsnapError } from '../errors.js';
import { codedBlobDigest } from '../manifest/blob-digest.js';
import type { RegionCodec, RegionInfo } from '../manifest/types.js';
import { native } from '../native/index.js';
import { HostRegion } from '../regions/host-region.js';
import { decodeChunkOffThread, encodeChunk, encodeChunkOffThread, type CodecKind } from '../transfer/codec.js';
import { codecConcurrency, inOrder } from '../transfer/in-order.js';

/**
 * A region's bytes coded chunk by chunk (vsnap-c1, on the CPU): the blob's bytes (the coded
 * chunks back to back), the manifest's `codec` and the blob's name in the store.
 * @internal
 */
export interface CodedBlob {
  readonly bytes: Buffer;
  readonly codec: RegionCodec;
  readonly digest: string;
}

/**
 * Codes `bytes` in chunks of `chunkSize` with a dtype hint; `checksums` are the raw chunks'
 * (the manifest's), and name the blob with them.
 * @internal
 */
export function encodeBlob(bytes: Uint8Array, chunkSize: number, checksums: readonly string[], hint: CodecKind = 'bytes'): CodedBlob {
  const chunks: Buffer[] = [];
  for (let at = 0; at < bytes.length; at += chunkSize) chunks.push(encodeChunk(bytes.subarray(at, Math.min(at + chunkSize, bytes.length)), hint));
  const codec: RegionCodec = { name: 'vsnap-c1', codedSizes: chunks.map((c) => c.length) };
  return { bytes: Buffer.concat(chunks), codec, digest: codedBlobDigest(bytes.length, chunkSize, checksums, codec.name, codec.codedSizes) };
}

/**
 * Where each chunk of a coded blob starts, and the blob's length (the last entry).
 * @internal
 */
export function codedOffsets(codec: RegionCodec): number[] {
  const out = [0];
  for (const s of codec.codedSizes) out.push(out.at(-1)! + s);
  return out;
}

/**
 * Reads chunk `index` of a region's blob at `path` (coded or raw), decodes it and checks it
 * against the manifest's checksum. A damaged chunk is E_CODEC_CORRUPT (its structure) or
 * E_CHECKSUM (its decoded bytes), naming the snapshot, region and chunk; a short blob is
 * E_BLOB_TRUNCATED.
 * @internal
 */
export async function readBlobChunk(path: string, region: RegionInfo, index: number, snapshot?: string): Promise<Buffer> {
  return (await readStoredChunk(path, region, index, snapshot)).raw;
}

/**
 * Reads chunk `index` of a region's blob as {@link readBlobChunk} does, and returns the bytes the
 * blob stores for it too: `stored`, its vsnap-c1 chunk where the blob is coded (else the raw bytes),
 * and `raw`, the decoded bytes, checked against the manifest's checksum (the same errors).
 * @internal
 */
export async function readStoredChunk(path: string, region: RegionInfo, index: number, snapshot?: string): Promise<{ stored: Buffer; raw: Buffer }> {
  const chunks = Math.ceil(region.size / region.chunkSize);
  if (!Number.isInteger(index) || index < 0 || index >= chunks) throw new VsnapError('E_OUT_OF_RANGE', `region ${region.key} has ${chunks} chunks, not a chunk ${index}`, { index, chunks });
  const rawSize = Math.min(region.chunkSize, region.size - index * region.chunkSize);
  const start = region.codec ? codedOffsets(region.codec)[index]! : index * region.chunkSize;
  const length = region.codec ? region.codec.codedSizes[index]! : rawSize;
  const data = Buffer.alloc(length);
  const file = await open(path, 'r');
  try {
    const { bytesRead } = await file.read(data, 0, length, start);
    if (bytesRead !== length) {
      throw new VsnapError('E_BLOB_TRUNCATED', `the blob of region ${region.key} ends inside chunk ${index}: restore from another copy or capture again`, { path, region: region.key, chunk: index, snapshot });
    }
  } finally {
    await file.close();
  }
  const raw = region.codec ? await decodeChunkOffThread(data, rawSize, { chunk: index, region: region.key, ...(snapshot === undefined ? {} : { snapshot }) }) : data;
  if (native().checksum(raw) !== region.checksums[index]) {
    throw new VsnapError(
      'E_CHECKSUM',
      `chunk ${index} of region ${region.key}${snapshot === undefined ? '' : ` in snapshot ${snapshot}`} does not match its checksum${region.codec ? ' after decoding' : ''}: restore from another copy or capture again`,
      { path, region: region.key, chunk: index, snapshot },
    );
  }
  return { stored: data, raw };
}

/**
 * The bytes a region's blob takes in the store: its coded chunks (`codec`), else its raw size.
 * @internal
 */
export function storedBytes(region: Pick<RegionInfo, 'size' | 'codec'>): number {
  return region.codec ? region.codec.codedSizes.reduce((n, s) => n + s, 0) : region.size;
}

/**
 * Codes the raw blob written at `path` (a capture's tmp file) chunk by chunk on the CPU, through
 * `path.coded` renamed over it: each chunk read back is checked against its checksum first (the
 * transfer took it while writing). Returns the manifest's `codec` and the blob's name, or
 * undefined (the file left raw) where the coded blob would not be smaller than the raw one.
 * @internal
 */
export async function codeBlobFile(path: string, region: Pick<RegionInfo, 'key' | 'size' | 'chunkSize' | 'checksums'>, hint: CodecKind): Promise<{ codec: RegionCodec; digest: string } | undefined> {
  const codedSizes: number[] = [];
  const input = await open(path, 'r');
  const output = await open(`${path}.coded`, 'wx', 0o644);
  let keep = false;
  try {
    let written = 0;
    const code = async (i: number): Promise<Buffer> => {
      const at = i * region.chunkSize;
      const raw = Buffer.allocUnsafe(Math.min(region.chunkSize, region.size - at));
      const { bytesRead } = await input.read(raw, 0, raw.length, at);
      if (bytesRead !== raw.length || native().checksum(raw) !== region.checksums[i]) {
        throw new VsnapError('E_CHECKSUM', `chunk ${i} of region ${region.key} changed on disk between the capture's write and its coding: nothing was published. Capture again.`, { region: region.key, chunk: i });
      }
      return encodeChunkOffThread(raw, hint);
    };
    await inOrder(Math.ceil(region.size / region.chunkSize), codecConcurrency(), code, async (coded) => {
      await output.write(coded, 0, coded.length, written);
      written += coded.length;
      codedSizes.push(coded.length);
    });
    if (written >= region.size) return undefined; // nothing shrank: the raw blob stays, shared with raw captures of the same bytes
    await output.sync();
    keep = true;
  } finally {
    await input.close();
    await output.close();
    if (!keep) await rm(`${path}.coded`, { force: true });
  }
  await rename(`${path}.coded`, path);
  const codec: RegionCodec = { name: 'vsnap-c1', codedSizes };
  return { codec, digest: codedBlobDigest(region.size, region.chunkSize, region.checksums, codec.name, codedSizes) };
}

/**
 * Reads a region's blob (coded or raw) into a memfd, every chunk decoded and checked against its
 * checksum first: a damaged chunk throws (E_CODEC_CORRUPT, E_CHECKSUM, E_BLOB_TRUNCATED) naming
 * its region and chunk before anything is returned. The caller closes the memfd.
 * @internal
 */
export async function readBlobDecoded(path: string, region: RegionInfo, snapshot: string): Promise<HostRegion> {
  const out = HostRegion.create(region.size, 'vsnap-decoded');
  try {
    const read = (i: number): Promise<Buffer> => readBlobChunk(path, region, i, snapshot);
    await inOrder(Math.ceil(region.size / region.chunkSize), codecConcurrency(), read, (raw, i) => out.write(i * region.chunkSize, raw));
    return out;
  } catch (err) {
    out.close();
    throw err;
  }
}
