import { decodeHeld, type HeldChunk } from '../cache/coded-tier.js';
import type { RamTier } from '../cache/ram-tier.js';
import { changedChunks } from '../digest/index.js';
import { toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { NativeHostBuffer } from '../native/index.js';
import type { RegionStore } from '../store/region-store.js';
import { passOn, runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { withChecksums } from './capture-manifest.js';
import { codeCapturedBlobs, type StoreCodec } from './coded-capture.js';
import { storedBytes } from '../store/coded-blob.js';
import { regionId } from '../manifest/region-id.js';
import { changedSinceCapture, persistCoded } from './persist-coded.js';

/**
 * Writes a capture held only in the RAM tier into the store (persist `async` or `off`), then
 * publishes it as any capture is (blobs, manifest, `current`); returns the manifest published.
 * Every region is hashed (XXH3) on its way from RAM to disk. A capture hashed when it landed
 * must give the same checksums again. One with its hash deferred gets its checksums here, and
 * its RAM copy must equal the GPU digests taken at capture: both are computed from one read of
 * each chunk (piece by piece, in cache), so the checksums published are of bytes that matched.
 * A capture held coded is decoded on the CPU, region by region, on its way (the checks are of the
 * decoded bytes); into coded blobs (`codec`), its held chunks are stored as they are, not encoded
 * again (persistCoded).
 * @internal
 */
export async function persistFromRamTier(store: RegionStore, manifest: Manifest, cache: RamTier, options: TransferOptions, codec: StoreCodec = 'off'): Promise<Manifest> {
  const lease = cache.hold(manifest.id);
  if (!lease) {
    throw new VsnapError(
      'E_NOT_DURABLE',
      `capture ${manifest.id} of '${manifest.name}' was kept only in the RAM tier, which no longer holds it (evicted or closed): it cannot be persisted. Capture it again.`,
      { name: manifest.name, id: manifest.id },
    );
  }
  try {
    const listed = [...manifest.regions()];
    const total = listed.reduce((sum, { region }) => sum + region.size, 0);
    const inRam = (rank: number, key: string) => ({ kind: 'buffer' as const, buffer: lease.buffer, offset: lease.offsets.get(regionId(rank, key))! });
    const txn = await store.beginCapture(manifest.name, total, manifest.id);
    let published = manifest;
    try {
      if (lease.chunks && codec !== 'off') {
        // Held coded, stored coded: the held chunks are the blobs' (checked, not encoded again).
        published = await persistCoded(manifest, lease.buffer, lease.chunks, (i) => txn.blobTmpPath(i), options.signal);
      } else {
        // A capture whose hash was deferred is checked against its GPU digests from the same read
        // that hashes it: each chunk is read once for both.
        const check = { ...(manifest.checksummed ? {} : { digest: true }), ...passOn(options) };
        const result = lease.chunks
          ? await persistDecoded(manifest, lease.buffer, lease.chunks, (i) => txn.blobTmpPath(i), check)
          : await runTransfer({
              op: 'capture',
              label: manifest.name,
              regions: listed.map(({ rank, region }, i) => ({
                name: region.key,
                blobPath: txn.blobTmpPath(i),
                size: region.size,
                chunkSize: region.chunkSize,
                memory: inRam(rank, region.key),
              })),
              ...check,
            });
        if (manifest.checksummed) {
          listed.forEach(({ rank, region }, i) => {
            const sums = result.checksums?.[i] ?? [];
            const bad = region.checksums.findIndex((c, k) => sums[k] !== c);
            if (bad >= 0 || sums.length !== region.checksums.length) throw changedSinceCapture(manifest, region.key, rank, Math.max(bad, 0), 'checksum');
          });
        } else {
          listed.forEach(({ rank, region }, i) => {
            const bad = changedChunks(region.digests ?? [], result.digests?.[i] ?? []);
            if (bad.length) throw changedSinceCapture(manifest, region.key, rank, bad[0]!, 'GPU digest');
          });
          published = withChecksums(manifest, result.checksums ?? []);
        }
        if (codec !== 'off') published = await codeCapturedBlobs(published, new Map(listed.map(({ rank, region }, i) => [regionId(rank, region.key), txn.blobTmpPath(i)])));
      }
      await txn.publish(published, [...published.regions()].map(({ region }, i) => ({ tmpPath: txn.blobTmpPath(i), size: storedBytes(region), digest: region.blob })));
    } catch (err) {
      await txn.abort();
      throw toVsnapError(err);
    }
    cache.markDurable(manifest.id);
    return published;
  } finally {
    lease.release();
  }
}

/**
 * Writes a capture held coded in the RAM tier into blobs: region by region (one decoded region in
 * memory at a time), every chunk decoded on the CPU (a damaged one refuses with E_CODEC_CORRUPT
 * naming it) and hashed on its way to disk as a raw capture is.
 */
async function persistDecoded(
  manifest: Manifest,
  buffer: NativeHostBuffer,
  chunks: ReadonlyMap<string, readonly HeldChunk[]>,
  blobPath: (i: number) => string,
  check: Pick<TransferOptions, 'threads' | 'signal' | 'onProgress'> & { digest?: boolean },
): Promise<{ checksums: string[][]; digests: string[][] }> {
  const checksums: string[][] = [];
  const digests: string[][] = [];
  let i = 0;
  for (const { rank, region } of manifest.regions()) {
    const decoded = await decodeHeld(buffer, region, chunks.get(regionId(rank, region.key))!, manifest.name);
    try {
      const r = await runTransfer({
        op: 'capture',
        label: manifest.name,
        regions: [{ name: region.key, blobPath: blobPath(i), size: region.size, chunkSize: region.chunkSize, memory: decoded.memory }],
        ...check,
      });
      checksums.push(r.checksums?.[0] ?? []);
      digests.push(r.digests?.[0] ?? []);
    } finally {
      decoded.close();
    }
    i++;
  }
  return { checksums, digests };
}
