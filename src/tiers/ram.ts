import type { RamTier } from '../cache/ram-tier.js';
import type { MultipathOptions } from '../transfer/multipath.js';
import type { Tier } from './tier.js';
import { hydrate } from './hydrate.js';

/*
 * Pinned host RAM (RamTier): a restore copies from it at PCIe line rate (a capture into it is
 * vouched for by its checksums or GPU digests); a snapshot it does not hold yet is loaded into it
 * from the store first (every chunk verified), so the next restore finds it there. With
 * `multipath`, an engine on one GPU is restored over two PCIe links (docs/multipath.md).
 */

/** @internal */
export function ramTier(ram: RamTier, multipath: MultipathOptions | undefined): Tier {
  return {
    name: 'ram',
    holds: (run) => run.snapshot !== undefined && ram.fits(run.snapshot.manifest),
    restore: (run) => hydrate(run, ram, multipath),
  };
}
