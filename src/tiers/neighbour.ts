import { toVsnapError, type VsnapError } from '../errors.js';
import type { NeighbourTier } from '../cache/neighbour-tier.js';
import type { Manifest } from '../manifest/manifest.js';
import { verifyRestored, type LiveRegionRef } from '../digest/compare.js';

/*
 * The neighbour-GPU tier inside the engine flows: a suspend parks the engine's weights in the
 * neighbour's free memory by peer copy before the engine sleeps, and a restore copies them back
 * from there (falling back to the RAM tier or the store when they are not there or the copy
 * fails). A layer above NeighbourTier, used by engine-flows.ts.
 *
 * Why device-to-device before the sleep, not host-to-neighbour from the RAM tier after it: the
 * peer copy runs at ~390 GB/s (a 17 GiB engine in ~45 ms), the live weights were just checked
 * against the snapshot (the dirty check), and no RAM-tier copy is needed. A host-to-neighbour
 * copy would run at PCIe speed (55 GB/s, 0.3 s) and, although off the suspend's path, contend
 * with the next restore's own host-to-GPU hydrate (the host memory bus, and the neighbour's
 * PCIe link that multi-path hydrate uses).
 */

/**
 * Where and whether a suspend parks the engine's weights in a neighbour GPU.
 * @public
 */
export interface NeighbourParkOptions {
  /** The tier to park in. */
  readonly tier: NeighbourTier;
  /**
   * Asked with the bytes the park would take before anything is copied: false skips the park
   * (the controller uses it to keep within the neighbour GPU's budget, evicting older entries
   * first). Default: always park (evicting the tier's least recently used entries to fit).
   */
  readonly admit?: (bytes: number) => boolean;
}

/**
 * What a park before the sleep did.
 * @public
 */
export interface NeighbourParkResult {
  /** The GPU the weights are parked on. */
  readonly device: number;
  /** Bytes held there (allocation granularity included). */
  readonly bytes: number;
  /** Seconds the copy and its verification took (0 when they were parked already). */
  readonly seconds: number;
  /** Whether this snapshot's weights were parked already (nothing copied). */
  readonly already: boolean;
}

/** Why a neighbour path was not taken; passed to the caller's warning. */
type Warn = (message: string) => void;

const hasDigests = (manifest: Manifest): boolean => [...manifest.regions()].every(({ region }) => region.digests);

/**
 * Parks the live regions of an engine (its exported memory, on one GPU) in the tier under the
 * snapshot's id, verified against its GPU digests. Never fails the suspend: a park that cannot
 * be made (no digests to check it against, no room, no peer access, a copy failure) is skipped
 * with a warning. @internal
 */
export async function parkBeforeSleep(
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

/** What a restore from the neighbour tier did (the shape of the hydrate step's result). @internal */
export interface NeighbourHydrate {
  readonly bytes: number;
  readonly tier: 'neighbour';
  readonly digestSeconds?: number;
  /** Per-GPU timings are reported by the RAM and store tiers only. */
  readonly devices?: undefined;
}

/**
 * Copies the weights parked under the snapshot's id back into the engine's regions, then
 * verifies the restored memory against the snapshot's GPU digests (always: they are the only
 * check of this path). `direct` are the regions as exported (what a peer copy takes), `mapped`
 * the same regions through the restore's mapping (what the digest reads). Returns undefined, with
 * a warning, when the tier does not hold them or the copy or its check fails (a parked copy that
 * fails its check is evicted): the caller hydrates from the RAM tier or the store, which
 * overwrites every byte. @internal
 */
export async function hydrateFromNeighbour(
  tier: NeighbourTier,
  manifest: Manifest,
  direct: readonly LiveRegionRef[],
  mapped: readonly LiveRegionRef[],
  warn: Warn,
  signal?: AbortSignal,
): Promise<NeighbourHydrate | undefined> {
  if (tier.closed || !tier.has(manifest.id) || !hasDigests(manifest)) return undefined;
  try {
    const copied = await tier.restore(manifest.id, direct);
    const digestSeconds = await verifyRestored(manifest, mapped);
    return { bytes: copied.bytes, tier: 'neighbour', ...(digestSeconds !== undefined ? { digestSeconds } : {}) };
  } catch (err) {
    const e: VsnapError = toVsnapError(err);
    if (signal?.aborted) throw e;
    if (e.code === 'E_DIGEST_MISMATCH') tier.evict(manifest.id); // a damaged parked copy is not tried again
    warn(`the restore of '${manifest.name}' from the neighbour tier on GPU ${tier.device} failed (${e.code}: ${e.message}); restoring from the RAM tier or the store instead`);
    return undefined;
  }
}
