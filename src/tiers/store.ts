import type { Tier } from './tier.js';
import { hydrate } from './hydrate.js';

/*
 * The store (RegionStore on disk): the tier that always holds a durable snapshot. Blobs are read
 * by several threads into pinned staging, every chunk verified, and copied into the mapped
 * regions; the restored memory is then checked against the snapshot's GPU digests.
 */

/** @internal */
export function storeTier(): Tier {
  return {
    name: 'store',
    holds: (run) => run.snapshot !== undefined,
    restore: (run) => hydrate(run, undefined, undefined),
  };
}
