import { toVsnapError, type VsnapError } from '../errors.js';
import type { NeighbourParkOptions, NeighbourParkResult, NeighbourTier } from '../cache/neighbour-tier.js';
import type { Manifest } from '../manifest/manifest.js';
import { verifyRestored, type LiveRegionRef } from '../digest/compare.js';
import { liveRefs } from '../engine/exported.js';
import type { Kept, RestoreRun, SuspendRun, Tier, TierRestore } from './tier.js';

/*
 * The neighbour-GPU tier inside the engine flows: a suspend parks the engine's weights in the
 * neighbour's free memory by peer copy before the engine sleeps, and a restore copies them back
 * from there (falling back to the RAM tier or the store when they are not there or the copy
 * fails). A tier over NeighbourTier (src/cache).
 *
 * Why device-to-device before the sleep, not host-to-neighbour from the RAM tier after it: the
 * peer copy runs at ~390 GB/s (a 17 GiB engine in ~45 ms), the live weights were just checked
 * against the snapshot (the dirty check), and no RAM-tier copy is needed. A host-to-neighbour
 * copy would run at PCIe speed (55 GB/s, 0.3 s) and, although off the suspend's path, contend
 * with the next restore's own host-to-GPU hydrate (the host memory bus, and the neighbour's
 * PCIe link that multi-path hydrate uses).
 */

/** Why a neighbour path was not taken; passed to the caller's warning. */
type Warn = (message: string) => void;

const hasDigests = (manifest: Manifest): boolean => [...manifest.regions()].every(({ region }) => region.digests);

/**
 * Parks the live regions of an engine (its exported memory, on one GPU) in the tier under the
 * snapshot's id, verified against its GPU digests. Never fails the suspend: a park that cannot
 * be made (no digests to check it against, no room, no peer access, a copy failure) is skipped
 * with a warning.
 */
async function parkBeforeSleep(
  options: NeighbourParkOptions,
  manifest: Manifest,
  live: readonly LiveRegionRef[],
  warn: Warn,
): Promise<NeighbourParkResult | undefined> {
  const { tier } = options;
  if (tier.closed) return undefined;
  if (tier.has(manifest.id)) return { device: tier.device, bytes: tier.entries().find((e) => e.id === manifest.id)!.bytes, seconds: 0, already: true };
  const skip = (why: string): undefined => {
    warn(`the weights of '${manifest.name}' were not parked on GPU ${tier.device}: ${why}`);
    return undefined;
  };
  if (!hasDigests(manifest)) return skip('its snapshot has no GPU digests to verify a parked copy against');
  const started = performance.now();
  try {
    const bytes = await tier.footprint(live);
    if (options.admit && !options.admit(bytes)) return undefined; // the caller's budget said no: not a fault
    await tier.park(manifest.id, live, { manifest, makeRoom: true });
    return { device: tier.device, bytes, seconds: (performance.now() - started) / 1000, already: false };
  } catch (err) {
    return skip(`${toVsnapError(err).code}: ${(err as Error).message}`);
  }
}

/**
 * The neighbour tier as the flows use it: `park` is a NeighbourTier, or one with an admission
 * rule (the controller's budget). @internal
 */
export function neighbourTier(park: NeighbourTier | NeighbourParkOptions): Tier {
  const options = 'tier' in park ? park : { tier: park };
  const { tier } = options;
  return {
    name: 'neighbour',
    holds: (run) => run.snapshot !== undefined && !tier.closed && tier.has(run.snapshot.id) && hasDigests(run.snapshot.manifest),
    restore: (run) => restoreParked(tier, run),
    async keep(run: SuspendRun): Promise<Kept | undefined> {
      const manifest = run.snapshot.manifest;
      const parked = await parkBeforeSleep(options, manifest, liveRefs(await run.exported()), (m) => run.warn(m));
      run.lap('park');
      if (!parked) return undefined;
      // The engine did not sleep: a copy parked for this suspend would be owned by nobody.
      return { tier: 'neighbour', parked, undo: () => void (parked.already || tier.evict(manifest.id)) };
    },
  };
}

/**
 * Copies the weights parked under the snapshot's id back into the engine's regions, then
 * verifies the restored memory against the snapshot's GPU digests (always: they are the only
 * check of this path). Undefined, with a warning, when the copy or its check fails (a parked copy
 * that fails its check is evicted): the next tier overwrites every byte.
 */
async function restoreParked(tier: NeighbourTier, run: RestoreRun): Promise<TierRestore | undefined> {
  const manifest = run.snapshot!.manifest;
  const targets = await run.targets();
  try {
    const copied = await tier.restore(manifest.id, targets.direct);
    const digestSeconds = await verifyRestored(manifest, targets.mapped);
    return { bytes: copied.bytes, tier: 'neighbour', ...(digestSeconds !== undefined ? { digestSeconds } : {}) };
  } catch (err) {
    const e: VsnapError = toVsnapError(err);
    if (targets.signal?.aborted) throw e;
    if (e.code === 'E_DIGEST_MISMATCH') tier.evict(manifest.id); // a damaged parked copy is not tried again
    run.warn(`the restore of '${manifest.name}' from the neighbour tier on GPU ${tier.device} failed (${e.code}: ${e.message}); restoring from the RAM tier or the store instead`);
    return undefined;
  }
}
