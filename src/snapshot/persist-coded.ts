import { open } from 'node:fs/promises';

import type { HeldChunk } from '../cache/coded-tier.js';
import { VsnapError } from '../errors.js';
import { codedBlobDigest } from '../manifest/blob-digest.js';
import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { RegionCodec } from '../manifest/types.js';
import { native, type NativeHostBuffer } from '../native/index.js';
import { CHUNK_HEADER_BYTES, decodeChunkOffThread, rawModeChunk } from '../transfer/codec.js';
import { codecConcurrency, inOrder } from '../transfer/in-order.js';
import { withChecksums } from './capture-manifest.js';
import { withCodedBlobs } from './coded-capture.js';

/** The RAM-tier copy of a chunk no longer matches what was taken at capture: nothing is persisted. @internal */
export function changedSinceCapture(manifest: Manifest, key: string, rank: number, chunk: number, against: string): VsnapError {
  return new VsnapError(
    'E_CHECKSUM',
    `the RAM-tier copy of region '${key}' (rank ${rank}) of '${manifest.name}' changed since it was captured (chunk ${chunk} does not match the ${against} taken at capture): nothing was persisted. Capture it again.`,
    { name: manifest.name, id: manifest.id, region: key, rank, chunk },
  );
}

/**
 * Writes a capture held coded in the RAM tier into coded store blobs without encoding anything
 * again: each held chunk is read once, decoded on the CPU and checked (against its checksum, or,
 * for a capture whose hash was deferred, against its GPU digest, its checksum then taken), and
 * stored as it is held (a chunk held raw behind a raw-mode header). A region whose coded blob
 * would not be smaller than its raw bytes is written raw, as a coded capture leaves it. Returns
 * the manifest to publish (checksums filled in, the coded regions' `codec` and blob names).
 * @internal
 */
export async function persistCoded(
  manifest: Manifest,
  buffer: NativeHostBuffer,
  chunks: ReadonlyMap<string, readonly HeldChunk[]>,
  blobPath: (i: number) => string,
  signal?: AbortSignal,
): Promise<Manifest> {
  const checksums: string[][] = [];
  const coded = new Map<string, { codec: RegionCodec; digest: string }>();
  let i = 0;
  for (const { rank, region } of manifest.regions()) {
    const id = regionId(rank, region.key);
    const held = chunks.get(id)!;
    const asCoded = held.reduce((n, c) => n + (c.coded ? c.held : c.rawSize + CHUNK_HEADER_BYTES), 0) < region.size;
    const sums: string[] = [];
    const codedSizes: number[] = [];
    const file = await open(blobPath(i++), 'wx', 0o644);
    try {
      let at = 0;
      const decode = async (k: number): Promise<{ bytes: Buffer; raw: Buffer }> => {
        signal?.throwIfAborted();
        const c = held[k]!;
        const bytes = buffer.read(c.at, c.held);
        return { bytes, raw: c.coded ? await decodeChunkOffThread(bytes, c.rawSize, { chunk: k, region: region.key, snapshot: manifest.name }) : bytes };
      };
      await inOrder(held.length, codecConcurrency(), decode, async ({ bytes, raw }, k) => {
        const c = held[k]!;
        const sum = native().checksum(raw);
        if (manifest.checksummed && sum !== region.checksums[k]) throw changedSinceCapture(manifest, region.key, rank, k, 'checksum');
        if (!manifest.checksummed && native().digestBytes(raw, region.chunkSize)[0] !== region.digests?.[k]) throw changedSinceCapture(manifest, region.key, rank, k, 'GPU digest');
        sums.push(sum);
        const out = !asCoded ? raw : c.coded ? bytes : rawModeChunk(raw);
        await file.write(out, 0, out.length, at);
        at += out.length;
        codedSizes.push(out.length);
      });
      await file.sync();
    } finally {
      await file.close();
    }
    checksums.push(sums);
    if (asCoded) {
      const codec: RegionCodec = { name: 'vsnap-c1', codedSizes };
      coded.set(id, { codec, digest: codedBlobDigest(region.size, region.chunkSize, sums, codec.name, codedSizes) });
    }
  }
  return withCodedBlobs(manifest.checksummed ? manifest : withChecksums(manifest, checksums), coded);
}
