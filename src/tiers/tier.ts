import type { NeighbourParkResult } from '../cache/neighbour-tier.js';
import type { LiveRegionRef } from '../digest/compare.js';
import type { CallOptions, EngineClient, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import type { ExportedRegions } from '../engine/export.js';
import type { VsnapError } from '../errors.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import type { DeviceTiming, RestoreRegion } from '../snapshot/snapshot-types.js';
import type { StagedTargets } from '../snapshot/staged.js';
import type { MultipathStats } from '../transfer/multipath.js';
import type { TransferOptions } from '../transfer/transfer.js';

/*
 * The tiers behind one interface. A tier is a place a suspended engine's weights can be kept and
 * restored from: tier 0 held by the SDK (gpu.ts), the engine's own tier 0 (engine.ts), a
 * neighbour GPU (neighbour.ts), pinned host RAM (ram.ts) and the store (store.ts). A restore
 * tries them in that order (tiers/index.ts builds the list) and takes the first that holds the
 * weights and serves them; a suspend asks each in turn to keep them. The flows (src/flows)
 * implement the runs the tiers work in; a tier sees only what these interfaces give it.
 */

/**
 * A tier: where an engine's weights are held, or came back from. The names are the keys of
 * {@link EngineTiers}: `engine` (the engine itself: its own tier 0 kept them, or, after a recovery,
 * it loaded them again from its checkpoint), `gpu` (tier 0 held by the SDK: they never left the
 * GPU), `neighbour` (a neighbour GPU, by peer copy), `ram` (pinned host RAM), and `store` (disk).
 * @public
 */
export type TierName = 'engine' | 'gpu' | 'neighbour' | 'ram' | 'store';

/** An engine's weights woken, exported, checked against the snapshot and mapped: what a hydrate (or a peer copy) fills. @internal */
export interface MappedTargets {
  readonly kind: 'mapped';
  /** The regions as exported (the descriptors: what a peer copy takes). */
  readonly direct: readonly LiveRegionRef[];
  /** The same regions through the restore's mapping (what a copy from the host and the GPU digest use). */
  readonly mapped: readonly LiveRegionRef[];
  /** The mapped regions as Snapshot.restore takes them. */
  readonly regions: readonly RestoreRegion[];
  /** Stops the hydrate: the restore's signal, and the failure of a KV-cache wake started beside it. */
  readonly signal: AbortSignal | undefined;
  /** The number of ranks exported. */
  readonly ranks: number;
}

/**
 * Memory made here for the weights, in two parts, which the engine's wake maps while the hydrate
 * fills it (flows/fill-targets.ts): `regions` are the first part's, the rest come with
 * `stages.rest` (Snapshot.restoreStaged). @internal
 */
export interface FilledTargets {
  readonly kind: 'filled';
  readonly regions: readonly RestoreRegion[];
  /** Stops the hydrate: the restore's signal, a table that does not match, the failure of the engine's wake (or of a KV-cache wake beside it). */
  readonly signal: AbortSignal | undefined;
  /** The number of ranks of the engine. */
  readonly ranks: number;
  readonly stages: StagedTargets;
}

/** What a hydrate fills. @internal */
export type HydrateTargets = MappedTargets | FilledTargets;

/** What a tier may use of the restore it serves (flows/restore-run.ts). @internal */
export interface RestoreRun {
  readonly client: EngineClient;
  readonly control: EngineControl;
  /** The snapshot restored; undefined when it could not be opened (only the engine's own tier can serve then). */
  readonly snapshot: Snapshot | undefined;
  /** The engine's status, re-read after a tier fell through. */
  readonly status: EngineStatus;
  readonly call: CallOptions;
  /** How a hydrate moves and checks bytes (threads, O_DIRECT, progress; blob verification, GPU digests). */
  readonly hydrate: Pick<TransferOptions, 'threads' | 'onProgress' | 'directIo'> & { readonly verify?: 'chunk' | 'all-first'; readonly verifyDigests?: boolean };
  warn(message: string): void;
  /** Records the time since the previous phase under `phase`. */
  lap(phase: 'wakeKvCache' | 'resetPrefixCache' | 'expectedResponse' | 'adoptWeights'): void;
  /**
   * The weights' targets (made once per run): with `fill`, where the engine allows, new memory made
   * here and checked against the snapshot, which the engine's wake maps while the hydrate fills it;
   * otherwise the weights woken, exported, validated and mapped. A KV-cache wake may start beside the hydrate.
   */
  targets(use: { fill: true }): Promise<HydrateTargets>;
  targets(use?: { fill?: false }): Promise<MappedTargets>;
  /** Wakes the other tags, resets the prefix cache, and checks the expected response. */
  finishWake(): Promise<void>;
  /** After a tier failed part way: re-reads the engine and puts it back to sleep if it holds weights, for the next tier. */
  fallBack(what: string, failure: VsnapError): Promise<void>;
  /** Puts the engine back to sleep if it holds weights (`wakeRest` false: without waking the KV cache first, for want of room); says what state it is in. */
  backToSleep(wakeRest?: boolean): Promise<{ state: string; asleep: boolean }>;
}

/** What a tier did when it served a restore. @internal */
export interface TierRestore {
  readonly tier: TierName;
  readonly bytes: number;
  /** The tier finished the wake itself (tier 0: a failed check falls through to the next tier). */
  readonly finished?: boolean;
  /** Seconds of the GPU digest of the restored memory, counted apart from the hydrate. */
  readonly digestSeconds?: number;
  readonly devices?: readonly DeviceTiming[];
  readonly multipath?: MultipathStats;
}

/** What a tier may use of the suspend it keeps weights for (flows/suspend.ts). @internal */
export interface SuspendRun {
  readonly client: EngineClient;
  /** The snapshot that brings the weights back (checked or captured before any tier keeps them). */
  readonly snapshot: Snapshot;
  warn(message: string): void;
  lap(phase: string): void;
  /** The weights, exported once for the whole suspend. */
  exported(): Promise<ExportedRegions>;
}

/** Weights a tier kept for a suspend. @internal */
export interface Kept {
  readonly tier: 'gpu' | 'neighbour';
  /** The neighbour tier: where the weights were parked. */
  readonly parked?: NeighbourParkResult;
  /** The engine did not sleep after all: let go of them (nobody would own them). */
  undo(): void;
}

/** One tier. @internal */
export interface Tier {
  readonly name: TierName;
  /** Whether it may hold this run's weights (no I/O). */
  holds(run: RestoreRun): boolean;
  /** Restores from it; undefined when it could not (it said why through `run.warn`): the next tier is tried. */
  restore(run: RestoreRun): Promise<TierRestore | undefined>;
  /** The restore no longer needs what this tier holds for it (it served, or was passed over): called before the next tier is tried. */
  release?(run: RestoreRun): void;
  /** At a suspend, before the sleep: keeps the weights (undefined: it did not, not a fault). */
  keep?(run: SuspendRun): Promise<Kept | undefined>;
}
