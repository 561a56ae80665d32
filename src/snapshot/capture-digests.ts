import { statSync } from 'node:fs';

import { changedChunks, digestRegions } from '../digest/index.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import type { RegionMemory } from '../regions/memory.js';
import { storedBytes } from '../store/coded-blob.js';
import type { RegionStore } from '../store/region-store.js';
import { regionId } from '../manifest/region-id.js';

// The GPU digest at capture: taken of the regions before they are copied, and used to share the
// regions unchanged since an earlier capture with it.

/**
 * The GPU digests of regions about to be captured, or nulls when they cannot be taken (a
 * warning says why; such a capture counts as stale at the next suspend and is taken again).
 * @internal
 */
export async function captureDigests(regions: ReadonlyArray<{ size: number; memory: RegionMemory }>, chunkSize: number): Promise<Array<string[] | null>> {
  try {
    return (await digestRegions(regions.map((r) => ({ size: r.size, chunkSize, memory: r.memory })))).digests;
  } catch (err) {
    process.emitWarning(`GPU digests could not be taken (${(err as Error).message}); the capture is recorded without them`, { code: 'VSNAP_DIGEST' });
    return regions.map(() => null);
  }
}

/**
 * Incremental capture: the regions (by index) whose live digests equal those of the same
 * region (rank, key, size, chunk size) in `base`, and whose blob the store still holds. Those
 * are not read again: the new manifest shares the base's blob and checksums.
 * @internal
 */
export function reusableRegions(
  store: RegionStore,
  base: Manifest | undefined,
  regions: ReadonlyArray<{ rank?: number; key: string; size: number }>,
  chunkSize: number,
  gpuDigests: ReadonlyArray<readonly string[] | null>,
): Map<number, RegionInfo> {
  const reused = new Map<number, RegionInfo>();
  if (!base) return reused;
  const prior = new Map([...base.regions()].map(({ rank, region }) => [regionId(rank, region.key), region]));
  regions.forEach((r, i) => {
    const p = prior.get(regionId(r.rank ?? 0, r.key));
    const live = gpuDigests[i];
    if (!p?.digests || !live || p.size !== r.size || p.chunkSize !== chunkSize || changedChunks(p.digests, live).length) return;
    try {
      if (statSync(store.blobPath(p.blob)).size === storedBytes(p)) reused.set(i, p);
    } catch {
      // the blob is gone: read the region again
    }
  });
  return reused;
}

