import { invalidArgument } from '../errors.js';
import { checkOptions } from '../options.js';
import { checkStoreCodec, type StoreCodec } from '../snapshot/coded-capture.js';
import type { EngineStatus } from '../engine/engine-client.js';
import { restoreTiers } from '../tiers/index.js';
import type { TierName } from '../tiers/tier.js';
import type { GpuRemap } from './gpu-remap.js';
import type { MaterializePolicy } from './recovery.js';
import type { EngineRestoreOptions } from './types.js';

/*
 * A restore's plan: every choice it makes, decided by pure functions from what is known at each
 * point (the options and the snapshot before the engine is touched; the engine's status after it
 * was read), so the choices are tested without an engine and the run (restore-run.ts) only carries
 * them out.
 */

/** What a snapshot that cannot be used leads to (restoreEngine's `recovery`, checked). @internal */
export interface RecoveryChoice {
  readonly reload: boolean;
  readonly materialize: MaterializePolicy;
  /** How the materialized capture writes the store's blobs. */
  readonly codec: StoreCodec;
}

/** A restore's plan before the engine is touched. @internal */
export interface RestorePlan {
  /** The tiers tried, in order: the first that holds the weights serves them (the store last). */
  readonly tiers: readonly TierName[];
  /** Make the first part of the weights' memory while the engine is read: only where the default targets surely follow. */
  readonly earlyFill: boolean;
  /** And copy into it at once from the RAM tier (which holds the snapshot). */
  readonly earlyCopy: boolean;
  /** How the restored bytes and the engine's answer are checked. */
  readonly checks: { readonly blobs: 'chunk' | 'all-first'; readonly digests: boolean; readonly logprobTolerance: number };
  readonly recovery: RecoveryChoice;
  /** Wake the KV cache beside the hydrate (overlapKvWake). */
  readonly kvBesideHydrate: boolean;
  /**
   * In a swap whose KV-cache wake waits for the other engine's sleep: a failed restore never wakes
   * this engine's KV cache to put it back to sleep (the room may never open).
   */
  readonly awaitsRoom: boolean;
}

/** What planRestore knows before the engine is touched. @internal */
export interface PlanInput {
  readonly options: EngineRestoreOptions;
  /** The snapshot, where it could be opened. */
  readonly snapshot: { readonly id: string; readonly durable: boolean } | undefined;
  /** The engine (its client's base URL), for tier 0's hold. */
  readonly engine: string;
  /** A swap's gate holds the KV cache's wake until the other engine slept. */
  readonly awaitsRoom: boolean;
}

/** The recovery option, checked: `fail` unless it says `reload`. @internal */
export function recoveryChoice(options: EngineRestoreOptions): RecoveryChoice {
  const r = options.recovery ?? 'fail';
  if (typeof r === 'object' && r !== null) checkOptions('restoreEngine options.recovery', r, ['policy', 'materialize', 'codec']);
  const { policy, materialize = 'off', codec } = typeof r === 'string' ? { policy: r, codec: undefined } : r;
  if (policy !== 'fail' && policy !== 'reload') invalidArgument('recovery', "'fail', 'reload' or { policy, materialize, codec }", r);
  if (materialize !== 'off' && materialize !== 'async' && materialize !== 'required') invalidArgument('recovery.materialize', "'off', 'async' or 'required'", materialize);
  return { reload: policy === 'reload', materialize, codec: checkStoreCodec(codec) };
}

/**
 * Plans a restore from its options and snapshot. The first part of the memory is made early only
 * where the weights will surely be copied into memory made here (the RAM tier or the store) and no
 * tier that keeps them elsewhere (tier 0 holding this engine's weights, the neighbour GPU, the
 * engine's own, two links) or a move can take the restore; whether the engine can adopt it is
 * known only from its status (planTargets), and where it cannot, the memory is let go unused.
 * @internal
 */
export function planRestore(input: PlanInput): RestorePlan {
  const { options, snapshot } = input;
  const t = options.tiers ?? {};
  const elsewhere = !!(options.move || t.engine || t.neighbour || t.multipath || options.allowModelSwap || t.gpu?.has(input.engine));
  const ramHolds = snapshot !== undefined && (t.ram?.has(snapshot.id) ?? false);
  const earlyFill = snapshot !== undefined && !elsewhere && (snapshot.durable || ramHolds);
  const v = options.verify ?? {};
  return {
    tiers: restoreTiers(t).map((tier) => tier.name),
    earlyFill,
    earlyCopy: earlyFill && ramHolds,
    checks: { blobs: v.blobs ?? 'chunk', digests: v.digests ?? true, logprobTolerance: v.logprobTolerance ?? 0 },
    recovery: recoveryChoice(options),
    kvBesideHydrate: options.overlapKvWake ?? false,
    awaitsRoom: input.awaitsRoom,
  };
}

/**
 * The targets' form, once the engine was read: `fill` (memory made here, adopted by the engine's
 * wake) where every rank is asleep with its weights unmapped, its plugin describes its regions
 * while asleep, and no move onto other GPUs is asked for (the memory would have to be made on a GPU
 * the process is not on yet); else `map` (the engine's own weights woken, exported, mapped here).
 * @internal
 */
export function planTargets(status: EngineStatus, remap: GpuRemap | undefined): 'fill' | 'map' {
  return !remap && status.sleeping && status.ranks.every((r) => r.describe === true && !r.weightsMapped) ? 'fill' : 'map';
}
