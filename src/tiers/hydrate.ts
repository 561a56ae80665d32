import type { RamTier } from '../cache/ram-tier.js';
import type { MultipathOptions } from '../transfer/multipath.js';
import type { RestoreRun, TierRestore } from './tier.js';

/**
 * Copies the snapshot into the engine's mapped weights, from the RAM tier (`ram`) or the store,
 * every chunk verified and the restored memory checked by GPU digest (Snapshot.restore). Two PCIe
 * links (`multipath`) only for an engine on one GPU: with several ranks each GPU's own link is in
 * use already. @internal
 */
export async function hydrate(run: RestoreRun, ram: RamTier | undefined, multipath: MultipathOptions | undefined): Promise<TierRestore> {
  // Memory filled here while the engine's wake maps it, except over two links (the neighbour GPU's
  // share is copied into the engine's own mappings there).
  const targets = multipath && run.status.ranks.length === 1 ? await run.targets() : await run.targets({ fill: true });
  const twoLinks = multipath && targets.ranks === 1 ? { multipath } : {};
  if (multipath && targets.ranks > 1) run.warn(`multipath skipped: the engine has ${targets.ranks} ranks (each GPU's own link is in use)`);
  const { verify, verifyDigests, ...transfer } = run.hydrate;
  const options = {
    regions: targets.regions,
    ...twoLinks,
    ...(ram ? { ram } : {}),
    ...(verify ? { verify } : {}),
    ...(verifyDigests !== undefined ? { verifyDigests } : {}),
    ...transfer,
    ...(targets.signal ? { signal: targets.signal } : {}),
    directIo: transfer.directIo ?? false,
  };
  const snapshot = run.snapshot!;
  const result = targets.kind === 'filled' ? await snapshot.restoreStaged(options, targets.stages) : await snapshot.restore(options);
  return {
    tier: result.tier === 'ram' ? 'ram' : 'store',
    bytes: result.bytes,
    ...(result.digestSeconds !== undefined ? { digestSeconds: result.digestSeconds } : {}),
    ...(result.devices ? { devices: result.devices } : {}),
    ...(result.multipath ? { multipath: result.multipath } : {}),
  };
}
