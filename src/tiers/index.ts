import type { RamTier } from '../cache/ram-tier.js';
import type { NeighbourParkOptions, NeighbourTier } from '../cache/neighbour-tier.js';
import type { GpuTier } from '../cache/gpu-tier.js';
import type { MultipathOptions } from '../transfer/multipath.js';
import { engineTier, type EngineTierOptions } from './engine.js';
import { gpuTier } from './gpu.js';
import { neighbourTier } from './neighbour.js';
import { ramTier } from './ram.js';
import { storeTier } from './store.js';
import type { Tier } from './tier.js';

export type { EngineTierOptions } from './engine.js';
export type { TierName } from './tier.js';

/**
 * Where a suspended engine's weights are kept, and where a restore looks for them, fastest first.
 * Given to a suspend, a tier keeps them (tier 0 holds them on the GPU, the neighbour GPU takes a
 * copy, the RAM tier takes the capture); given to a restore, the first tier that holds them serves
 * them, and the store (always last) serves what none holds.
 * @public
 */
export interface EngineTiers {
  /**
   * Tier 0 held by the SDK: a suspend keeps a reference to every weights region, so the sleep
   * frees only the KV cache; a restore maps the same memory back (no bytes move). Released after
   * the restore (or when {@link GpuTier.release} demotes it).
   */
  readonly gpu?: GpuTier;
  /**
   * The engine's own tier 0 (vLLM's `release_kv_cache_memory`): a suspend frees only the KV cache
   * and needs no snapshot; a restore wakes it. Not with `gpu`, `neighbour` or a deep suspend.
   */
  readonly engine?: boolean | EngineTierOptions;
  /**
   * A neighbour GPU's free memory: a suspend parks the weights there by peer copy (verified by GPU
   * digest; a park that cannot be made is skipped with a warning); a restore copies them back, or
   * goes on from the RAM tier or the store when they are not there.
   */
  readonly neighbour?: NeighbourTier | NeighbourParkOptions;
  /** Pinned host RAM: captures land there first; restores copy from there (loading it from the store first). */
  readonly ram?: RamTier;
  /** With `ram`: restore an engine on one GPU over two PCIe links (docs/multipath.md). */
  readonly multipath?: MultipathOptions;
}

/** The keys of {@link EngineTiers}, and of its `engine` object. @internal */
export const TIER_KEYS = ['gpu', 'engine', 'neighbour', 'ram', 'multipath'];
/** @internal */
export const ENGINE_TIER_KEYS = ['check', 'expected', 'queued'];

/** The tiers a restore tries, in order; the engine's own first, the store last. @internal */
export function restoreTiers(tiers: EngineTiers): Tier[] {
  return [
    ...(tiers.engine ? [engineTier(tiers.engine === true ? {} : tiers.engine)] : []),
    ...(tiers.gpu ? [gpuTier(tiers.gpu)] : []),
    ...(tiers.neighbour ? [neighbourTier(tiers.neighbour)] : []),
    ...(tiers.ram ? [ramTier(tiers.ram, tiers.multipath)] : []),
    storeTier(),
  ];
}

/** The tiers a suspend asks to keep the weights, in order (the first that keeps them wins). @internal */
export function keepingTiers(tiers: EngineTiers): Tier[] {
  return [...(tiers.gpu ? [gpuTier(tiers.gpu)] : []), ...(tiers.neighbour ? [neighbourTier(tiers.neighbour)] : [])];
}
