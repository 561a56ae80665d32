import type { HostCache } from '../cache/host-cache.js';
import { toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionStore } from '../store/region-store.js';
import { passOn, runTransfer, type TransferOptions } from '../transfer/transfer.js';

/**
 * Writes a capture held only in the RAM tier into the store (persist `async` or `off`): every
 * region is hashed again on its way from RAM to disk and must match the checksums taken when it
 * was captured, then published as any capture is (blobs, manifest, `current`).
 * @internal
 */
export async function persistFromRamTier(store: RegionStore, manifest: Manifest, cache: HostCache, options: TransferOptions): Promise<void> {
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
    const txn = await store.beginCapture(manifest.name, total, manifest.id);
    try {
      const result = await runTransfer({
        op: 'capture',
        label: manifest.name,
        regions: listed.map(({ rank, region }, i) => ({
          name: region.key,
          blobPath: txn.blobTmpPath(i),
          size: region.size,
          chunkSize: region.chunkSize,
          memory: { kind: 'buffer' as const, buffer: lease.buffer, offset: lease.offsets.get(`${rank}/${region.key}`)! },
        })),
        ...passOn(options),
      });
      listed.forEach(({ rank, region }, i) => {
        const sums = result.checksums?.[i] ?? [];
        const bad = region.checksums.findIndex((c, k) => sums[k] !== c);
        if (bad >= 0 || sums.length !== region.checksums.length) {
          throw new VsnapError(
            'E_CHECKSUM',
            `the RAM-tier copy of region '${region.key}' (rank ${rank}) of '${manifest.name}' changed since it was captured (chunk ${Math.max(bad, 0)}): nothing was persisted. Capture it again.`,
            { name: manifest.name, id: manifest.id, region: region.key, rank, chunk: Math.max(bad, 0) },
          );
        }
      });
      await txn.publish(manifest, listed.map(({ region }, i) => ({ tmpPath: txn.blobTmpPath(i), size: region.size, digest: region.blob })));
    } catch (err) {
      await txn.abort();
      throw toVsnapError(err);
    }
    cache.markDurable(manifest.id);
  } finally {
    lease.release();
  }
}
