import { open } from 'node:fs/promises';

import { VsnapError } from '../errors.js';
import { codedBlobDigest } from '../manifest/blob-digest.js';
import type { RegionCodec, RegionInfo } from '../manifest/types.js';
import { native } from '../native/index.js';
import { decodeChunk, encodeChunk, type CodecKind } from '../transfer/codec.js';

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
  const raw = region.codec ? decodeChunk(data, rawSize, { chunk: index, region: region.key, ...(snapshot === undefined ? {} : { snapshot }) }) : data;
  if (native().checksum(raw) !== region.checksums[index]) {
    throw new VsnapError(
      'E_CHECKSUM',
      `chunk ${index} of region ${region.key}${snapshot === undefined ? '' : ` in snapshot ${snapshot}`} does not match its checksum${region.codec ? ' after decoding' : ''}: restore from another copy or capture again`,
      { path, region: region.key, chunk: index, snapshot },
    );
  }
  return raw;
}
