import type { Registry } from 'prom-client';

import type { RamTier } from '../cache/ram-tier.js';
import type { NeighbourTier } from '../cache/neighbour-tier.js';
import type { GpuTier } from '../cache/gpu-tier.js';
import type { EngineClient } from '../engine/engine-client.js';
import type { ResponseCheckOptions } from '../engine/response-check.js';
import type { ErrorCode, VsnapError } from '../errors.js';
import type { CheckpointBackend } from '../flows/deep.js';
import type { RecoveryPolicy, RecoveryReason } from '../flows/recovery.js';
import type { RecoveryOptions } from '../flows/types.js';
import type { RegistrySource } from '../registry/source.js';
import type { StoreCodec } from '../snapshot/coded-capture.js';
import type { TierName } from '../tiers/tier.js';
import type { RegionStore } from '../store/region-store.js';
import type { MultipathOptions } from '../transfer/multipath.js';
import type { EngineState } from './planner.js';

/* The SwapController's public types: its options, its views and its events (events.ts). */

export type { EngineState } from './planner.js';

/**
 * One engine the controller manages.
 * @public
 */
export interface SwapEngine {
  /** The model name requests ask for (the OpenAI `model` field). */
  readonly name: string;
  /** The client of the engine (with its token). */
  readonly client: EngineClient;
  /** The snapshot that holds its weights (default: `name`). */
  readonly snapshot?: string;
  /**
   * Where its snapshot comes from when the store lacks it: pulled under `snapshot` by the first
   * restore that needs it (with recovery `reload`, the default: with `fail`, a missing snapshot is
   * refused before the restore), then local.
   */
  readonly from?: RegistrySource;
  /** The GPUs it uses (default [0]). */
  readonly devices?: readonly number[];
  /** GPU memory it holds on each of its devices while awake (weights, KV cache, graphs, context). */
  readonly memoryBytes: number;
  /** GPU memory it still holds on each device while suspended (context, graphs; default 0). */
  readonly asleepBytes?: number;
  /** Never suspended to make room; woken at start. */
  readonly pinned?: boolean;
  /** Suspended after this long without requests. */
  readonly idleTtlMs?: number;
  /** At most one engine of a group is awake at a time. */
  readonly group?: string;
  /** Weights bytes per device: with tier 0, what stays on the GPU while it is suspended. */
  readonly weightsBytes?: number;
  /**
   * Suspend it deep (`suspendEngine`'s `deep`): its worker processes are checkpointed to host
   * RAM, so while suspended it counts as 0 bytes on its GPUs (its `asleepBytes` is ignored).
   * Tier 0 does not keep its weights.
   */
  readonly deepSuspend?: boolean;
  /**
   * With `deepSuspend`, for an engine on one GPU: other GPUs (ordinals, of the same kind) its
   * deep-suspended process may be restored onto when its own GPU has no room and one of these
   * has, instead of suspending another engine (restoreEngine's `move.onto`; driver r580+). The
   * engine then runs, and counts, on its new GPU ({@link EngineView.devices}).
   */
  readonly movableTo?: readonly number[];
  /** The expected-response check its captures record (default: a prefill check, one token). */
  readonly check?: ResponseCheckOptions;
}

/**
 * The neighbour-GPU tier of a {@link SwapController}: a GPU and a byte budget, or a tier you made
 * (and keep: the controller then does not close it).
 * @public
 */
export type SwapNeighbourOptions = NeighbourTier | { readonly device: number; readonly budgetBytes: number };

/**
 * Where a {@link SwapController} keeps suspended engines' weights besides their snapshots, and
 * restores them from ({@link SwapControllerOptions.tiers}).
 * @public
 */
export interface SwapTiers {
  /** Restore through this RAM tier; captures the controller makes land in it too (and in the store, in one pass). */
  readonly ram?: RamTier;
  /**
   * Tier 0: keep suspended engines' weights on the GPU while the budget allows (engines need
   * `weightsBytes`); the least recently suspended are demoted (released) first when room is needed.
   */
  readonly gpu?: GpuTier;
  /**
   * The neighbour-GPU tier: a suspend parks the engine's weights in this GPU's free memory (peer
   * copy before the sleep, verified by GPU digest) when they fit the tier's budget and the GPU's
   * (its least recently used entries are evicted first), and a restore copies them back from
   * there (the swap event's tier is `neighbour`), else from the RAM tier or the store. Parked
   * bytes count against the GPU's budget: a wake that needs that room evicts them first. For
   * engines on one GPU other than this one. A `{ device, budgetBytes }` tier is made and closed by
   * the controller; a NeighbourTier you pass stays yours.
   */
  readonly neighbour?: SwapNeighbourOptions;
  /**
   * Restore from the RAM tier over two PCIe links: each restore of an engine on one GPU other
   * than `multipath.neighbour` streams part of its bytes through that GPU (host → neighbour →
   * NVLink peer copy), see restoreEngine's `tiers.multipath` and docs/multipath.md. The neighbour
   * needs room only for the copy ring (`ringSlots` × `chunkSize`, 256 MiB by default) while a
   * restore runs; where it has none, the restore takes the direct path alone.
   */
  readonly multipath?: MultipathOptions;
}

/**
 * The queue of requests waiting for their engine ({@link SwapControllerOptions.queue}).
 * @public
 */
export interface SwapQueueOptions {
  /** Requests that may wait for one engine (default 64); beyond that, E_BUSY. */
  readonly limit?: number;
  /** How long a request may wait for its engine (default 120 s); then E_TIMEOUT. */
  readonly timeoutMs?: number;
}

/**
 * The controller's test seams. @internal
 */
export interface SwapHooks {
  /** The process checkpoint calls for deepSuspend engines (tests inject a fake). */
  readonly checkpoint?: CheckpointBackend;
}

/**
 * Options of {@link SwapController.create}. Unknown keys are refused (E_INVALID_ARGUMENT, naming
 * the key and where it went, or the one it is likely a typo of).
 * @public
 */
export interface SwapControllerOptions {
  /** Where the engines' snapshots are. */
  readonly store: RegionStore;
  /** The engines, with distinct names. */
  readonly engines: readonly SwapEngine[];
  /** GPU memory the engines may use, per device ordinal. */
  readonly budgets: Readonly<Record<number, number>>;
  /** Where suspended engines' weights are kept besides their snapshots; see {@link SwapTiers}. */
  readonly tiers?: SwapTiers;
  /**
   * When an engine's snapshot cannot be used (missing, damaged, incompatible, RAM copy lost):
   * `reload` (the default) has the engine reload its weights from its own checkpoint, so the model
   * stays servable (slower, but checked against the snapshot's expected response where there is
   * one); `fail` leaves it unservable until re-captured. After a reload a new snapshot is captured:
   * `materialize` `async` (the default here: in the background while it serves), `required` or
   * `off`. See restoreEngine's `recovery`.
   */
  readonly recovery?: RecoveryPolicy | RecoveryOptions;
  /**
   * Overlap swaps (default true): when an engine is suspended to make room for another whose
   * weights fit beside it on every device, the two run as one {@link swapEngines} (`weights`:
   * the new engine's KV cache wakes once the old one sleeps), and every restore wakes the KV
   * cache while its hydrate runs (restoreEngine's `overlapKvWake`: safe here, as no request
   * reaches an engine before it is awake). The weights bytes are the engine's `weightsBytes`,
   * else its snapshot's largest rank.
   */
  readonly overlap?: boolean;
  /** Capture a snapshot when suspending an engine that has none (default true). */
  readonly captureIfNeeded?: boolean;
  /**
   * How the captures the controller makes write the store's blobs (a suspend that captures first,
   * the `materialize` capture after a recovery): `vsnap-c1` coded, `off` (default) raw; see
   * {@link CaptureOptions.codec}. A RAM tier codes what it holds by its own `codec`.
   */
  readonly codec?: StoreCodec;
  /** Woken whenever nothing else is awake or asked for. */
  readonly defaultModel?: string;
  /** The queue of requests waiting for their engine; see {@link SwapQueueOptions}. */
  readonly queue?: SwapQueueOptions;
  /** A prom-client registry to put the metrics in (default: the controller's own, {@link SwapController.registry}). */
  readonly metrics?: Registry;
  /**
   * @internal Engines `vsnap serve` is still booting (starting, pulling, capturing, suspending
   * them outside the controller): each counts as awake and in use, so it is never woken,
   * suspended or given requests and its memory is never given to another engine, until
   * {@link SwapController.releaseBootHold}. Their state is not read at create.
   */
  readonly booting?: readonly string[];
}

/**
 * An engine's state, for status pages.
 * @public
 */
export interface EngineView {
  /** The model name. */
  readonly name: string;
  /** What it is doing. */
  readonly state: EngineState;
  /** The GPUs it runs on now: its `devices`, or the GPU a move put it on ({@link SwapEngine.movableTo}). */
  readonly devices: readonly number[];
  /** Requests using it now. */
  readonly leases: number;
  /** Requests waiting for it. */
  readonly waiting: number;
  /** Last use, ms since the epoch. */
  readonly lastUsed: number;
  /** Whether it is pinned awake. */
  readonly pinned: boolean;
  /** Its last failure (set while `failed`; after a failed suspend or demotion too, until it answers or wakes again). */
  readonly error?: string;
  /**
   * Why its snapshot cannot bring it back, when known (a restore failed on a damaged blob, its
   * blobs are missing, the store has none): no engine is suspended for it until it is re-captured
   * or {@link SwapController.verifySnapshot} passes. Short, without paths.
   */
  readonly snapshotProblem?: string;
  /**
   * With tier 0 ({@link SwapTiers.gpu}): GPU memory per device that still holds its weights while
   * it is suspended (a wake maps them back, no copy). Absent when none is held.
   */
  readonly weightsHeldBytes?: number;
  /** Its last recovery through the engine's own loader (absent when none happened since it was last restored from a snapshot). */
  readonly recovery?: RecoveryView;
  /** With a neighbour tier ({@link SwapTiers.neighbour}): bytes of its weights parked there now. Absent when none. */
  readonly neighbourBytes?: number;
}

/**
 * An engine's last recovery, for status pages.
 * @public
 */
export interface RecoveryView {
  /** Why its snapshot could not be used. */
  readonly reason: RecoveryReason;
  /** The snapshot's error code. */
  readonly code: ErrorCode;
  /** When, ms since the epoch. */
  readonly at: number;
  /** The new snapshot: `off` (none asked for), `capturing`, `captured` or `failed`. */
  readonly snapshot: 'off' | 'capturing' | 'captured' | 'failed';
}

/**
 * The neighbour tier, for status pages.
 * @public
 */
export interface NeighbourView {
  /** The GPU holding the parked weights. */
  readonly device: number;
  /** The tier's byte budget. */
  readonly budgetBytes: number;
  /** Bytes parked now. */
  readonly usedBytes: number;
  /** What is parked, least recently used first: the snapshot id, the engine it was parked for (when known), its bytes. */
  readonly entries: ReadonlyArray<{ readonly id: string; readonly engine?: string; readonly bytes: number }>;
}

/**
 * Permission to send requests to an awake engine: it is not suspended until released.
 * @public
 */
export interface Lease {
  /** The model name. */
  readonly engine: string;
  /** Its client: send the request with it. */
  readonly client: EngineClient;
  /** Call once the request is done (idempotent). */
  release(): void;
}

/**
 * A finished suspend or restore (the `swap` event, {@link SwapControllerEvents.swap}).
 * @public
 */
export interface SwapEvent {
  /** The model name. */
  readonly engine: string;
  /** What was done. */
  readonly action: 'suspend' | 'restore';
  /** How long it took. */
  readonly seconds: number;
  /** Seconds per phase (a suspend's as suspendEngine reports them: `awaitCopy`, in an overlapped swap, is its sleep's wait for the other engine's copy). */
  readonly phases?: Readonly<Record<string, number>>;
  /** restore: the tier the weights came from ({@link TierName}: `gpu`, tier 0, nothing copied; `neighbour`, by peer copy; `engine`, the engine kept them itself or, with `recovered`, reloaded them). */
  readonly tier?: TierName;
  /** restore: set when the snapshot could not be used and the engine reloaded its weights instead. */
  readonly recovered?: RecoveryReason;
  /** suspend: whether a snapshot was captured first. */
  readonly captured?: boolean;
  /** restore over two PCIe links ({@link SwapTiers.multipath}): the bytes that went through the neighbour GPU. */
  readonly bytesViaNeighbour?: number;
}
