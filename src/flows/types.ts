import type { RamTier } from '../cache/ram-tier.js';
import type { NeighbourParkResult } from '../cache/neighbour-tier.js';
import type { LiveCheckReport } from '../digest/compare.js';
import type { ResponseCheckOptions } from '../engine/response-check.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { RegionStore } from '../store/region-store.js';
import type { RegistrySource } from '../registry/source.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import type { StoreCodec } from '../snapshot/coded-capture.js';
import type { CaptureHash, DeviceTiming, PersistPolicy } from '../snapshot/snapshot-types.js';
import type { EngineTiers, TierName } from '../tiers/index.js';
import type { MultipathStats } from '../transfer/multipath.js';
import type { TransferProgress } from '../transfer/transfer.js';
import type { GpuRef } from './gpu-remap.js';
import type { RestorePhase, RestorePhases, RestoreRoute } from './phases.js';
import type { EngineRecovery, MaterializePolicy, RecoveryPolicy } from './recovery.js';

/* The options and reports of the engine flows (capture.ts, suspend.ts, restore.ts, swap.ts). */

/**
 * How a flow moves bytes.
 * @public
 */
export interface TransferTuning {
  /** Called about every 100 ms with progress. */
  readonly onProgress?: (progress: TransferProgress) => void;
  /** Worker threads (default: one per core, at most 16). */
  readonly threads?: number;
  /**
   * Read blobs with O_DIRECT (cold data, skipping the page cache; restores from the store only),
   * coded blobs decoded on the GPU included; coded blobs decoded on the CPU are read through the
   * page cache, as with `Snapshot.restore`'s `directIo`.
   */
  readonly directIo?: boolean;
}

/**
 * Options of {@link captureEngine}.
 * @public
 */
export interface EngineCaptureOptions {
  /** The expected-response check recorded at capture and re-run after every restore (default: a prefill check, one token). */
  readonly check?: ResponseCheckOptions;
  /** Free-form labels for the manifest. */
  readonly labels?: Readonly<Record<string, string>>;
  /** Checksum granularity (default 64 MiB). */
  readonly chunkSize?: number;
  /** Land the capture in this RAM tier first; see {@link CaptureOptions.ram}. */
  readonly ram?: RamTier;
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
  /** How the store's blobs are written (default `off`, raw); see {@link CaptureOptions.codec}. */
  readonly codec?: StoreCodec;
  /** How the bytes move. */
  readonly transfer?: Omit<TransferTuning, 'directIo'>;
  /** Cancels the capture. */
  readonly signal?: AbortSignal;
  /** Called with warnings (e.g. an attention backend known to break after sleep). Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
}

/**
 * Moving a deep-suspended engine onto other GPUs as it is restored ({@link EngineRestoreOptions.move}).
 * @public
 */
export interface EngineMove {
  /**
   * An engine on one GPU: restore its process onto this GPU (an ordinal in this process, or a
   * UUID), then wake and hydrate its weights there. The GPU must be of the same kind (name and
   * compute capability; else E_INVALID_ARGUMENT before anything changes) and have room for the
   * process and its weights. Needs driver r580+ (else E_CHECKPOINT_UNSUPPORTED, and the engine
   * stays deep-suspended where it was). An engine that is not deep-suspended is refused
   * (E_ENGINE_STATE). See {@link EngineRestoreReport.gpus}.
   */
  readonly onto?: GpuRef;
  /**
   * Like `onto`, for an engine on several GPUs, from each old GPU to its new one (ordinals in this
   * process or UUIDs). The driver is given a whole permutation of the GPUs this process sees (the
   * GPUs displaced take the ones vacated, the others stay), the same for every rank.
   */
  readonly gpuMap?: Readonly<Record<string, GpuRef>>;
  /**
   * The GPU memory, in bytes per rank, that the process restore is assumed to need on its new GPU
   * (default: what the plugin reports the process held, else 2 GiB). Before any driver call each
   * new GPU must have this plus the rank's weights free, else E_INVALID_ARGUMENT
   * (`details.gpus`: needed and free) and the engine stays deep-suspended where it is.
   */
  readonly reserveBytes?: number;
}

/**
 * How a restore checks what it restored ({@link EngineRestoreOptions.verify}).
 * @public
 */
export interface RestoreVerification {
  /** When blob chunks are verified: `chunk` (default, each before it is copied) or `all-first`; see {@link RestoreOptions.verify}. */
  readonly blobs?: 'chunk' | 'all-first';
  /** Compare the restored memory with the snapshot's GPU digests (default true); see {@link RestoreOptions.verifyDigests}. */
  readonly digests?: boolean;
  /** Largest |logprob difference| the expected-response check accepts (default 0: bit-identical). */
  readonly logprobTolerance?: number;
}

/**
 * What {@link restoreEngine} does when its snapshot cannot be used: `fail` (the default) or
 * `reload`, and after a reload whether a new snapshot is captured.
 * @public
 */
export interface RecoveryOptions {
  /** `fail` (default) throws the snapshot's error; `reload` has the engine load its weights again (see {@link RecoveryReason}). */
  readonly policy: RecoveryPolicy;
  /** After a reload: capture a new snapshot `off` (default), `async` or `required`; see {@link MaterializePolicy}. */
  readonly materialize?: MaterializePolicy;
  /** How that capture writes the store's blobs (default `off`, raw); see {@link CaptureOptions.codec}. */
  readonly codec?: StoreCodec;
}

/**
 * Options of {@link restoreEngine}.
 * @public
 */
export interface EngineRestoreOptions {
  /** Where to look for the weights before the store, fastest first; see {@link EngineTiers}. */
  readonly tiers?: EngineTiers;
  /**
   * When the snapshot cannot be used (see {@link RecoveryReason}): `fail` (default) throws its
   * error; `reload` (or `{ policy: 'reload', materialize }`) has the engine load its weights again
   * from its own checkpoint (vLLM's level-2 wake with `reload_weights`), checks the expected
   * response where the snapshot's manifest has one, and follows `materialize`. The report says
   * which path ran.
   */
  readonly recovery?: RecoveryPolicy | RecoveryOptions;
  /** A deep-suspended engine restored onto other GPUs; see {@link EngineMove}. */
  readonly move?: EngineMove;
  /** How the restored bytes and the engine's answer are checked; see {@link RestoreVerification}. */
  readonly verify?: RestoreVerification;
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
   * awake engines. A tier-0 restore never overlaps.
   */
  readonly overlapKvWake?: boolean;
  /** Allow restoring a snapshot of another model with the same layout (same architecture) into a running engine. */
  readonly allowModelSwap?: boolean;
  /** How the bytes move. */
  readonly transfer?: TransferTuning;
  /** Cancels the restore (the engine is put back to sleep). */
  readonly signal?: AbortSignal;
  /** Called with warnings. Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
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
 * A deep suspend ({@link EngineSuspendOptions.deep}).
 * @public
 */
export interface DeepSuspendOptions {
  /** How long each worker gets to reach a lockable point (default 10 s). */
  readonly lockTimeoutMs?: number;
}

/**
 * Options of {@link (suspendEngine:1)}.
 * @public
 */
export interface EngineSuspendOptions {
  /**
   * Where to keep the weights while it sleeps, besides the snapshot: `gpu` (tier 0: only the KV
   * cache is freed), `neighbour` (parked by peer copy), `ram` (a capture lands there), `engine`
   * (the engine keeps them itself; no snapshot is checked or made). See {@link EngineTiers}.
   */
  readonly tiers?: EngineTiers;
  /** Capture a snapshot first when none matches (else refuse with E_NOT_RESTORABLE). */
  readonly captureIfNeeded?: boolean;
  /** Re-hash every blob of the matching snapshot before sleeping (default: check they exist with the right sizes). */
  readonly verifyBlobs?: boolean;
  /**
   * When the live weights differ from the snapshot (the dirty check, by GPU digest, before any
   * discard): `capture` (default) captures again, reading only the changed regions, then
   * suspends; `refuse` fails with E_STALE naming them. A version-1 snapshot (no digests)
   * counts as stale.
   */
  readonly onStale?: 'capture' | 'refuse';
  /** vLLM's sleep mode for in-flight requests, where the engine supports it. */
  readonly mode?: 'abort' | 'wait' | 'keep';
  /**
   * Deep suspend: after the level-2 sleep, lock and then checkpoint every worker process with the
   * driver's process checkpoint API (r570+), so the engine holds no GPU memory at all (its CUDA
   * context, graph pool and NCCL buffers move to host RAM). {@link restoreEngine} brings the
   * processes back first. Fails with E_CHECKPOINT_UNSUPPORTED, before anything changes, where
   * the driver lacks the API. Not with `tiers.gpu` or `tiers.engine`.
   */
  readonly deep?: boolean | DeepSuspendOptions;
  /** Options of the capture, when one is made. */
  readonly capture?: EngineCaptureOptions;
  /** Cancels the operation. */
  readonly signal?: AbortSignal;
  /** Called with warnings. Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
}

/**
 * What a restore into an engine did, phase by phase.
 * @public
 */
export interface EngineRestoreReport {
  /** Bytes restored. */
  readonly bytes: number;
  /** Where the weights came from ({@link TierName}): `engine` when the engine kept them itself (route `kept`) or loaded them again (route `reloaded`). */
  readonly tier: TierName;
  /** Wall time of the whole restore. */
  readonly seconds: number;
  /** How the weights came back; it says which phases {@link EngineRestoreReport.phases} may list. */
  readonly route: RestoreRoute;
  /** Seconds per phase, in the order they ran (see {@link RestorePhase}); those that ran beside others are in `overlapped`. */
  readonly phases: RestorePhases;
  /** `restored` from the snapshot (or a tier), or `recovered` through the engine's own loader (see `recovery`). */
  readonly path: 'restored' | 'recovered';
  /** What the recovery did, when `path` is `recovered`. */
  readonly recovery?: EngineRecovery;
  /** With `move`: the GPU (UUID) each rank runs on now, in rank order, as its export reported it. */
  readonly gpus?: readonly string[];
  /** Each GPU's share of the hydrate and of the digest check (ram and store tiers; one per rank with tensor parallelism). */
  readonly devices?: readonly DeviceTiming[];
  /** With `tiers.multipath`, when the hydrate ran over two links: how its bytes were split. */
  readonly multipath?: MultipathStats;
  /**
   * The phases that ran beside others (absent: none), so the phases add up to more than `seconds`:
   * route `filled`'s `describe`, `validate`, `allocateRest` and `wakeWeights` (beside the hydrate);
   * with `overlapKvWake`, `awaitRoom` and `wakeKvCache` (`wakeKvCacheWait`: what was left after the hydrate).
   */
  readonly overlapped?: readonly RestorePhase[];
}

/**
 * What a suspend did.
 * @public
 */
export interface EngineSuspendResult {
  /** The snapshot that can bring the weights back. */
  readonly snapshot: Snapshot;
  /** The tier that kept the weights besides the snapshot ({@link TierName}): `gpu` (tier 0 held by the SDK), `engine` (the engine kept them itself) or `neighbour` (absent: only the snapshot holds them, in the store and, where it took the capture, the RAM tier). */
  readonly tier?: Extract<TierName, 'gpu' | 'engine' | 'neighbour'>;
  /** Whether a capture was made first. */
  readonly captured: boolean;
  /** Whether the engine was already asleep (nothing was done). */
  readonly alreadyAsleep: boolean;
  /** Wall time. */
  readonly seconds: number;
  /**
   * Seconds per phase, in order: status, check (export and the restorability check), capture
   * (when one was made), hold (tier 0) or park (neighbour), sleep. Empty when the engine was
   * already asleep. `digest` (the dirty check) comes after check when a snapshot was there to
   * compare with. With `deep`: `deep.checkState`, `deep.lock`, `deep.checkpoint` after sleep.
   */
  readonly phases: Readonly<Record<string, number>>;
  /** The dirty check's outcome (absent when there was no snapshot to compare with, or the engine was asleep). */
  readonly liveCheck?: LiveCheckReport;
  /** With `tiers.neighbour`: where the weights were parked (absent when they were not). */
  readonly parked?: NeighbourParkResult;
  /** With `tiers.engine` and its `check`: the engine's answer, recorded before the suspend. */
  readonly expected?: ExpectedResponse;
}

/**
 * What a suspend with `tiers.engine` did: the engine keeps its weights itself, so there may be no
 * snapshot (`snapshot` is the store's current one, if it has one).
 * @public
 */
export interface EngineTierSuspendResult extends Omit<EngineSuspendResult, 'snapshot'> {
  /** The store's current snapshot of that name, if any (none is needed). */
  readonly snapshot: Snapshot | undefined;
}
