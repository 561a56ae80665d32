import type { HostCache } from '../cache/host-cache.js';
import type { ResidentWeights } from '../cache/resident-weights.js';
import type { RegionStore } from '../store/region-store.js';
import type { TransferOptions } from '../transfer/transfer.js';
import type { MultipathOptions, MultipathStats } from '../transfer/multipath.js';
import type { ResponseCheckOptions } from './response-check-options.js';
import type { CheckpointBackend } from './deep-suspend.js';
import type { GpuRef } from './gpu-remap.js';
import type { EngineRecovery, MaterializePolicy, RecoveryPolicy, RecoveryReason } from './engine-recovery.js';
import type { LiveCheckReport } from './live-check.js';
import type { Snapshot } from './snapshot.js';
import type { CaptureHash, CaptureOptions, DeviceTiming, PersistPolicy } from './snapshot-types.js';
import type { RegistrySource } from '../registry/source.js';
import type { NeighbourTier } from '../gpu/neighbour-tier.js';
import type { NeighbourParkOptions, NeighbourParkResult } from './neighbour-flows.js';

/* The options and reports of the engine flows (engine-capture.ts, engine-suspend.ts, engine-flows.ts). */

/**
 * Options of {@link captureEngine}.
 * @public
 */
export interface EngineCaptureOptions extends TransferOptions {
  /** The expected-response check recorded at capture and re-run after every restore (default: a prefill check, one token). */
  readonly check?: ResponseCheckOptions;
  /** Same as `check.prompt` (which wins). */
  readonly probePrompt?: string;
  /** Same as `check.maxTokens` (which wins). */
  readonly probeMaxTokens?: number;
  /** Free-form labels for the manifest. */
  readonly labels?: Readonly<Record<string, string>>;
  /** Checksum granularity (default 64 MiB). */
  readonly chunkSize?: number;
  /** Called with warnings (e.g. an attention backend known to break after sleep). Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
  /** Land the capture in this RAM tier first; see {@link CaptureOptions.cache}. */
  readonly cache?: HostCache;
  /**
   * When the store gets the capture (default `sync`). With `async` or `off`, a suspend that
   * captures first frees the GPU once the weights are in the RAM tier; until the store has them,
   * a crash of this process loses them and the engine must reload its checkpoint.
   */
  readonly persist?: PersistPolicy;
  /** When the chunks' checksums are taken (default `deferred` with persist `async` or `off`); see {@link CaptureHash}. */
  readonly hash?: CaptureHash;
  /** Incremental capture on top of this earlier capture; see {@link CaptureOptions.base}. */
  readonly base?: Snapshot;
}

/**
 * Options of {@link restoreEngine}.
 * @public
 */
export interface EngineRestoreOptions extends TransferOptions {
  /** Restore through the RAM tier. */
  readonly cache?: HostCache;
  /** Tier 0: when it holds this engine's weights for this snapshot, map them back (no bytes move). */
  readonly resident?: ResidentWeights;
  /** See {@link RestoreOptions.verify}. */
  readonly verify?: 'chunk' | 'all-first';
  /** Allow restoring a snapshot of another model with the same layout (same architecture) into a running engine. */
  readonly allowModelSwap?: boolean;
  /** Largest |logprob difference| the expected-response check accepts (default 0: bit-identical). */
  readonly logprobTolerance?: number;
  /** Called with warnings. Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
  /** See {@link RestoreOptions.verifyDigests} (default true). */
  readonly verifyDigests?: boolean;
  /** @internal The process checkpoint calls (tests inject a fake). */
  readonly checkpointBackend?: CheckpointBackend;
  /**
   * A deep-suspended engine on one GPU: restore its process onto this GPU instead (an ordinal
   * in this process, or a UUID), then wake and hydrate its weights there. The GPU must be of
   * the same kind (name and compute capability; else E_INVALID_ARGUMENT before anything
   * changes) and have room for the process and its weights. Needs driver r580+ (else
   * E_CHECKPOINT_UNSUPPORTED, and the engine stays deep-suspended where it was). An engine that
   * is not deep-suspended is refused (E_ENGINE_STATE). See {@link EngineRestoreReport.gpus}.
   */
  readonly onto?: GpuRef;
  /**
   * Like `onto`, for an engine on several GPUs, from each old GPU to its new one (ordinals in this process or
   * UUIDs). The driver is given a whole permutation of the GPUs this process sees (the GPUs
   * displaced take the ones vacated, the others stay), the same for every rank.
   */
  readonly gpuMap?: Readonly<Record<string, GpuRef>>;
  /**
   * With `onto` / `gpuMap`: the GPU memory, in bytes per rank, that the process restore is
   * assumed to need on its new GPU (default 2 GiB: the CUDA context, CUDA-graph pool and other
   * memory still resident after a level-2 sleep; no API reports it). Before any driver call each
   * new GPU must have this plus the rank's weights free, else E_INVALID_ARGUMENT
   * (`details.gpus`: needed and free) and the engine stays deep-suspended where it is.
   */
  readonly ontoReserveBytes?: number;
  /**
   * When the snapshot cannot be used (see {@link RecoveryReason}): `fail` (default) throws its
   * error; `reload` has the engine load its weights again from its own checkpoint (vLLM's
   * level-2 wake with `reload_weights`), checks the expected response where the snapshot's
   * manifest has one, and follows `materialize`. The report says which path ran.
   */
  readonly recovery?: RecoveryPolicy;
  /** After a recovery: capture a new snapshot `off` (default), `async` or `required`; see {@link MaterializePolicy}. */
  readonly materialize?: MaterializePolicy;
  /** @internal Runs after the wake, before the expected-response check (tests flip a weights byte here). */
  readonly beforeCheck?: () => Promise<void>;
  /**
   * Hydrate from the RAM tier over two PCIe links: the engine's GPU's own, and a neighbour GPU's
   * (host → neighbour → peer copy over NVLink), see docs/multipath.md and
   * {@link RestoreOptions.multipath}. Used only where it applies: a restore from the RAM tier of
   * an engine on one GPU (with tensor parallelism every GPU's own link is busy already; a restore
   * from the store or tier 0 ignores it, and `onWarning` says so for an engine with several ranks).
   * The restored memory is still verified by its GPU digests before the engine is woken further.
   */
  readonly multipath?: MultipathOptions;
  /**
   * Wake the KV cache while the hydrate runs, instead of after it (default false; RAM tier and
   * store only). The wake is timed as `wakeKvCache` and listed in
   * {@link EngineRestoreReport.overlapped}. The restore still resolves only once the weights
   * verified, the KV cache woke, the prefix cache was reset and the expected response matched;
   * any failure of either puts the engine back to sleep. The catch: vLLM resumes scheduling as
   * soon as no memory is asleep (vllm/v1/engine/core.py `wake_up`; no tag keeps it paused), so
   * the engine schedules again before the hydrate ends, and a request reaching it then (or one
   * it queued while asleep) would run on half-restored weights. Use it only where nothing sends
   * the engine requests until the restore resolves: the SwapController does, as it leases only
   * awake engines. A tier-0 restore never overlaps: its adopt is the engine's own work, which
   * the engine core runs one call at a time anyway.
   */
  readonly overlapKvWake?: boolean;
  /**
   * @internal Awaited before the KV cache wakes ({@link swapEngines}: the other engine's sleep,
   * which frees the memory the KV cache takes). A rejection fails the restore, and the engine
   * goes back to sleep.
   */
  readonly beforeKvWake?: () => Promise<void>;
  /**
   * The neighbour-GPU tier: when it holds this snapshot's weights (parked by a suspend, under the
   * snapshot's id), they are copied back from the neighbour GPU (peer copy) and verified against
   * the snapshot's GPU digests; the report's tier is `neighbour`. When it does not hold them, or
   * the copy or its check fails (or they are evicted meanwhile), the restore goes on from the RAM
   * tier or the store, with a warning.
   */
  readonly neighbour?: NeighbourTier;
}

/**
 * A snapshot to restore, by name, opened by {@link restoreEngine} itself: so that one that is
 * missing or unreadable can be recovered from (with `recovery: 'reload'`).
 * @public
 */
export interface SnapshotRef {
  /** The store holding it. */
  readonly store: RegionStore;
  /** Its name. */
  readonly name: string;
  /** A capture id (default: the current one). */
  readonly id?: string;
  /**
   * Where to get it when the store does not have it: pulled from this registry reference under
   * `name` first (checked against the engine's facts before any layer moves), then restored; when
   * the store has it, no network. A pull that fails is, for `recovery: 'reload'`, a `missing`
   * snapshot (E_REGISTRY, E_REGISTRY_AUTH, E_REGISTRY_TIMEOUT, E_SNAPSHOT_NOT_FOUND) or a `damaged` one (E_CHECKSUM).
   */
  readonly from?: RegistrySource;
}

/**
 * Options of {@link suspendEngine}.
 * @public
 */
export interface EngineSuspendOptions {
  /** Capture a snapshot first when none matches (else refuse with E_NOT_RESTORABLE). */
  readonly captureIfNeeded?: boolean;
  /** Re-hash every blob of the matching snapshot before sleeping (default: check they exist with the right sizes). */
  readonly verifyBlobs?: boolean;
  /** vLLM's sleep mode for in-flight requests, where the engine supports it. */
  readonly mode?: 'abort' | 'wait' | 'keep';
  /** Options of the capture, when one is made. */
  readonly capture?: EngineCaptureOptions;
  /** Cancels the operation. */
  readonly signal?: AbortSignal;
  /** Called with warnings. Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
  /** Tier 0: keep the weights on the GPU (only the KV cache is freed); the next restore maps them back. */
  readonly resident?: ResidentWeights;
  /**
   * When the live weights differ from the snapshot (the dirty check, by GPU digest, before any
   * discard): `capture` (default) captures again, reading only the changed regions, then
   * suspends; `refuse` fails with E_STALE naming them. A version-1 snapshot (no digests)
   * counts as stale.
   */
  readonly onStale?: 'capture' | 'refuse';
  /**
   * Deep suspend: after the level-2 sleep, lock and then checkpoint every worker process with the
   * driver's process checkpoint API (r570+), so the engine holds no GPU memory at all (its CUDA
   * context, graph pool and NCCL buffers move to host RAM). {@link restoreEngine} brings the
   * processes back first. Fails with E_CHECKPOINT_UNSUPPORTED, before anything changes, where
   * the driver lacks the API. Not with `resident`.
   */
  readonly deep?: boolean;
  /** How long deep suspend waits for each worker to reach a lockable point (default 10 s). */
  readonly lockTimeoutMs?: number;
  /** @internal The process checkpoint calls (tests inject a fake). */
  readonly checkpointBackend?: CheckpointBackend;
  /**
   * Park the weights in a neighbour GPU's tier before the sleep (peer copy from the live weights,
   * verified against the snapshot's GPU digests), for {@link EngineRestoreOptions.neighbour}. A
   * park that cannot be made is skipped with a warning; it never fails the suspend. Not with
   * `resident` (tier 0 keeps the weights where they are).
   */
  readonly neighbour?: NeighbourTier | NeighbourParkOptions;
}

/**
 * What a restore into an engine did, phase by phase.
 * @public
 */
export interface EngineRestoreReport {
  /** Bytes restored. */
  readonly bytes: number;
  /** Where the weights came from: `gpu` (tier 0: mapped back, no copy), `neighbour` (a neighbour GPU's tier, by peer copy), `ram`, `store`, or `engine` (recovered: the engine loaded them). */
  readonly tier: 'gpu' | 'neighbour' | 'ram' | 'store' | 'engine';
  /** Wall time of the whole restore. */
  readonly seconds: number;
  /**
   * Seconds per phase, in order: sleep (model swap only), prepare (the engine's status, the
   * snapshot opened, each rank's checkpoint state read from the driver), then wakeWeights, export, validate
   * (the snapshot's layout and facts checked against the engine's), map (every region mapped
   * once, for the hydrate and its verification), hydrate (or adoptWeights for tier 0), then
   * wakeKvCache, resetPrefixCache, expectedResponse. A deep-suspended engine starts with
   * `deep.restore`, `deep.unlock`. A recovery adds reloadWeights (and materialize, when required).
   */
  readonly phases: Readonly<Record<string, number>>;
  /** `restored` from the snapshot, or `recovered` through the engine's own loader (see `recovery`). */
  readonly path: 'restored' | 'recovered';
  /** What the recovery did, when `path` is `recovered`. */
  readonly recovery?: EngineRecovery;
  /** With `onto` / `gpuMap`: the GPU (UUID) each rank runs on now, in rank order, as its export reported it. */
  readonly gpus?: readonly string[];
  /** Each GPU's share of the hydrate and of the digest check (ram and store tiers; one per rank with tensor parallelism). */
  readonly devices?: readonly DeviceTiming[];
  /** With `multipath`, when the hydrate ran over two links: how its bytes were split. */
  readonly multipath?: MultipathStats;
  /**
   * The phases that ran concurrently with others (absent: none), so the phases add up to more
   * than `seconds`. With `overlapKvWake`: `wakeKvCache` (and `awaitRoom`, the wait for the other
   * engine's sleep in a swap) ran during the hydrate; `wakeKvCacheWait` is the part of the wake
   * the restore still waited for after its hydrate.
   */
  readonly overlapped?: readonly string[];
}

/**
 * What a suspend did.
 * @public
 */
export interface EngineSuspendResult {
  /** The snapshot that can bring the weights back. */
  readonly snapshot: Snapshot;
  /** Whether a capture was made first. */
  readonly captured: boolean;
  /** Whether the engine was already asleep (nothing was done). */
  readonly alreadyAsleep: boolean;
  /** Wall time. */
  readonly seconds: number;
  /**
   * Seconds per phase, in order: status, check (export and the restorability check), capture
   * (when one was made), hold (tier 0), sleep. Empty when the engine was already asleep.
   * `digest` (the dirty check) comes after check when a snapshot was there to compare with.
   * With `deep`: `deep.checkState`, `deep.lock`, `deep.checkpoint` after sleep.
   */
  readonly phases: Readonly<Record<string, number>>;
  /** The dirty check's outcome (absent when there was no snapshot to compare with, or the engine was asleep). */
  readonly liveCheck?: LiveCheckReport;
  /** With `neighbour`: where the weights were parked (absent when they were not). */
  readonly parked?: NeighbourParkResult;
}

