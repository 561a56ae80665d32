import type { RamTier } from '../cache/ram-tier.js';
import { changedChunks } from '../digest/index.js';
import { toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionStore } from '../store/region-store.js';
import { passOn, runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { withChecksums } from './capture-manifest.js';
import { regionId } from '../manifest/region-id.js';

function changedSinceCapture(manifest: Manifest, key: string, rank: number, chunk: number, against: string): VsnapError {
  return new VsnapError(
    'E_CHECKSUM',
    `the RAM-tier copy of region '${key}' (rank ${rank}) of '${manifest.name}' changed since it was captured (chunk ${chunk} does not match the ${against} taken at capture): nothing was persisted. Capture it again.`,
    { name: manifest.name, id: manifest.id, region: key, rank, chunk },
  );
}

/**
 * Writes a capture held only in the RAM tier into the store (persist `async` or `off`), then
 * publishes it as any capture is (blobs, manifest, `current`); returns the manifest published.
 * Every region is hashed (XXH3) on its way from RAM to disk. A capture hashed when it landed
 * must give the same checksums again. One with its hash deferred gets its checksums here, and
 * its RAM copy must equal the GPU digests taken at capture: both are computed from one read of
 * each chunk (piece by piece, in cache), so the checksums published are of bytes that matched.
 * @internal
 */
export async function persistFromRamTier(store: RegionStore, manifest: Manifest, cache: RamTier, options: TransferOptions): Promise<Manifest> {
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
      const result = await runTransfer({
        op: 'capture',
        label: manifest.name,
        regions: listed.map(({ rank, region }, i) => ({
          name: region.key,
          blobPath: txn.blobTmpPath(i),
          size: region.size,
          chunkSize: region.chunkSize,
          memory: inRam(rank, region.key),
        })),
        // A capture whose hash was deferred is checked against its GPU digests from the same
        // read that hashes it: each chunk is read once for both.
        ...(manifest.checksummed ? {} : { digest: true }),
        ...passOn(options),
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
      await txn.publish(published, [...published.regions()].map(({ region }, i) => ({ tmpPath: txn.blobTmpPath(i), size: region.size, digest: region.blob })));
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
