import { EventEmitter } from 'node:events';

import type { Registry } from 'prom-client';

import type { HostCache } from '../cache/host-cache.js';
import type { ResidentWeights } from '../cache/resident-weights.js';
import type { ResponseCheckOptions } from '../engine/response-check.js';
import type { CheckpointBackend } from '../flows/deep.js';
import type { MaterializePolicy, RecoveryPolicy, RecoveryReason } from '../flows/recovery.js';
import type { EngineClient } from '../engine/engine-client.js';
import type { RegistrySource } from '../registry/source.js';
import type { MultipathOptions } from '../transfer/multipath.js';
import { abortError, invalidArgument, VsnapError } from '../errors.js';
import { restorableFor } from '../flows/index.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { RegionStore, VerifyReport } from '../store/region-store.js';
import { SwapExecutor, type Slot, type Waiter } from './executor.js';
import { SwapMetrics } from './metrics.js';
import { type EngineState, usage } from './planner.js';
import { NeighbourParking, type NeighbourView, type SwapNeighbourOptions } from './neighbour-parking.js';

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
   * has, instead of suspending another engine (restoreEngine's `onto`; driver r580+). The
   * engine then counts on its new GPU.
   */
  readonly movableTo?: readonly number[];
  /** The expected-response check its captures record (default: a prefill check, one token). */
  readonly check?: ResponseCheckOptions;
}

/**
 * Options of {@link SwapController.create}.
 * @public
 */
export interface SwapControllerOptions {
  /** Where the engines' snapshots are. */
  readonly store: RegionStore;
  /** The engines, with distinct names. */
  readonly engines: readonly SwapEngine[];
  /** GPU memory the engines may use, per device ordinal. */
  readonly budgets: Readonly<Record<number, number>>;
  /** Restore through this RAM tier; captures the controller makes land in it too (and in the store, in one pass). */
  readonly cache?: HostCache;
  /**
   * Tier 0: keep suspended engines' weights on the GPU while the budget allows (engines need
   * `weightsBytes`); the least recently suspended are demoted (released) first when room is needed.
   */
  readonly resident?: ResidentWeights;
  /** @internal The process checkpoint calls for deepSuspend engines (tests inject a fake). */
  readonly checkpointBackend?: CheckpointBackend;
  /**
   * @internal Engines `vsnap serve` is still booting (starting, pulling, capturing, suspending
   * them outside the controller): each counts as awake and in use, so it is never woken,
   * suspended or given requests and its memory is never given to another engine, until
   * {@link SwapController.releaseBootHold}. Their state is not read at create.
   */
  readonly booting?: readonly string[];
  /** Woken whenever nothing else is awake or asked for. */
  readonly defaultModel?: string;
  /** Requests that may wait for one engine (default 64); beyond that, E_BUSY. */
  readonly queueLimit?: number;
  /** How long a request may wait for its engine (default 120 s); then E_TIMEOUT. */
  readonly queueTimeoutMs?: number;
  /** Capture a snapshot when suspending an engine that has none (default true). */
  readonly captureIfNeeded?: boolean;
  /** A prom-client registry to put the metrics in (default: the controller's own). */
  readonly registry?: Registry;
  /**
   * When an engine's snapshot cannot be used (missing, damaged, incompatible, RAM copy lost):
   * `reload` (default) has the engine reload its weights from its own checkpoint, so the model
   * stays servable (slower, but checked against the snapshot's expected response where there is
   * one); `fail` leaves it unservable until re-captured. See restoreEngine's `recovery`.
   */
  readonly recovery?: RecoveryPolicy;
  /** After a recovery, capture a new snapshot: `async` (default: in the background while it serves), `required` or `off`. */
  readonly materialize?: MaterializePolicy;
  /**
   * Overlap swaps (default true): when an engine is suspended to make room for another whose
   * weights fit beside it on every device, the two run as one {@link swapEngines} (`weights`:
   * the new engine's KV cache wakes once the old one sleeps), and every restore wakes the KV
   * cache while its hydrate runs (restoreEngine's `overlapKvWake`: safe here, as no request
   * reaches an engine before it is awake). The weights bytes are the engine's `weightsBytes`,
   * else its snapshot's largest rank.
   */
  readonly overlap?: boolean;
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
   * NVLink peer copy), see restoreEngine's `multipath` and docs/multipath.md. The neighbour needs
   * room only for the copy ring (`ringSlots` × `chunkSize`, 256 MiB by default) while a restore
   * runs; where it has none, the restore takes the direct path alone.
   */
  readonly multipath?: MultipathOptions;
}

export type { EngineState } from './planner.js';

/**
 * An engine's state, for status pages.
 * @public
 */
export interface EngineView {
  /** The model name. */
  readonly name: string;
  /** What it is doing. */
  readonly state: EngineState;
  /** Requests using it now. */
  readonly leases: number;
  /** Requests waiting for it. */
  readonly waiting: number;
  /** Last use, ms since the epoch. */
  readonly lastUsed: number;
  /** Whether it is pinned awake. */
  readonly pinned: boolean;
  /** The last failure, when state is `failed`. */
  readonly error?: string;
  /**
   * Why its snapshot cannot bring it back, when known (a restore failed on a damaged blob, its
   * blobs are missing, the store has none): no engine is suspended for it until it is re-captured
   * or {@link SwapController.verifySnapshot} passes. Short, without paths.
   */
  readonly snapshotProblem?: string;
  /**
   * With tier 0 ({@link SwapControllerOptions.resident}): GPU memory per device that still holds
   * its weights while it is suspended (a wake maps them back, no copy). Absent when none is held.
   */
  readonly weightsHeldBytes?: number;
  /** Its last recovery through the engine's own loader (absent when none happened since it was last restored from a snapshot). */
  readonly recovery?: RecoveryView;
  /** With a neighbour tier ({@link SwapControllerOptions.neighbour}): bytes of its weights parked there now. Absent when none. */
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
  readonly code: string;
  /** When, ms since the epoch. */
  readonly at: number;
  /** The new snapshot: `off` (none asked for), `capturing`, `captured` or `failed`. */
  readonly snapshot: 'off' | 'capturing' | 'captured' | 'failed';
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
 * A swap event (`controller.on('swap', …)`).
 * @public
 */
export interface SwapEvent {
  /** The model name. */
  readonly engine: string;
  /** What was done. */
  readonly action: 'suspend' | 'restore';
  /** How long it took. */
  readonly seconds: number;
  /** restore: seconds per phase. */
  readonly phases?: Readonly<Record<string, number>>;
  /** restore: where the weights came from (`gpu`: tier 0, nothing copied; `neighbour`: a neighbour GPU's tier, by peer copy; `engine`: recovered, the engine reloaded them). */
  readonly tier?: 'gpu' | 'neighbour' | 'ram' | 'store' | 'engine';
  /** restore: set when the snapshot could not be used and the engine reloaded its weights instead. */
  readonly recovered?: RecoveryReason;
  /** suspend: whether a snapshot was captured first. */
  readonly captured?: boolean;
  /** restore over two PCIe links (SwapControllerOptions.multipath): the bytes that went through the neighbour GPU. */
  readonly bytesViaNeighbour?: number;
}

/**
 * Time-shares GPUs between engines: keeps awake only what fits each device's budget, wakes the
 * engine a request asks for (suspending the least recently used idle ones to make room), and
 * hands out leases so that no request ever reaches a sleeping engine. Decisions come from a pure
 * planner; every change of state (wake-ups, suspends, manual ones included, resyncs) runs through
 * one serial executor, so swaps never overlap and requests for an engine being woken wait in a
 * bounded queue. Before any engine is suspended to make room, the one asked for is checked to be
 * restorable; a restore that fails on a damaged snapshot marks it (see
 * {@link EngineView.snapshotProblem}) so no engine is evicted for it again. Pinned engines stay
 * awake, idle engines with a TTL are suspended, and a default model is woken when nothing else is
 * wanted. Emits `swapStarted` (with engine and action), `swap` ({@link SwapEvent}, when one
 * finished, with phase timings), `swapFailed` (with engine, action and the full error, for the
 * operator's log), `snapshotDamaged` (engine, snapshotId, reason, detail), `recovered` (engine,
 * reason, code, message, seconds, expectedResponse: a restore went through the engine's own
 * loader, see {@link SwapControllerOptions.recovery}), `materialized` (engine, snapshotId) or
 * `materializeFailed` (engine, error) after it, with a neighbour tier `parked` (engine,
 * snapshotId, device, bytes, seconds) and `neighbourEvicted` (snapshotId, engine, reason: room,
 * budget, lru or stale, for), and `change` (after every state change); exports
 * Prometheus metrics.
 * @public
 */
export class SwapController extends EventEmitter {
  /** The Prometheus registry with the controller's metrics. */
  readonly registry: Registry;
  private readonly options: SwapControllerOptions;
  private readonly slots = new Map<string, Slot>();
  private readonly metrics: SwapMetrics;
  private readonly executor: SwapExecutor;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  private constructor(options: SwapControllerOptions) {
    super();
    this.options = options;
    this.metrics = new SwapMetrics(options.registry);
    this.registry = this.metrics.registry;
    for (const e of options.engines) {
      if (this.slots.has(e.name)) invalidArgument('engines', 'engines with distinct names', e.name);
      if (!Number.isSafeInteger(e.memoryBytes) || e.memoryBytes <= 0) invalidArgument(`${e.name}.memoryBytes`, 'a positive byte count', e.memoryBytes);
      const spec = { ...e, snapshot: e.snapshot ?? e.name, devices: e.devices ?? [0], asleepBytes: e.asleepBytes ?? 0 };
      for (const d of [...spec.devices, ...(e.movableTo ?? [])]) {
        if (options.budgets[d] === undefined) invalidArgument('budgets', `a budget for device ${d} (used by ${e.name})`, options.budgets);
      }
      if (e.movableTo?.length && (!e.deepSuspend || spec.devices.length !== 1)) invalidArgument(`${e.name}.movableTo`, 'an engine on one GPU with deepSuspend', e.movableTo);
      this.slots.set(e.name, { spec, state: 'asleep', leases: 0, lastUsed: 0, waiters: [] });
    }
    for (const name of options.booting ?? []) {
      const slot = this.slots.get(name);
      if (!slot) invalidArgument('booting', 'names of the engines', name);
      Object.assign(slot, { state: 'awake', leases: 1, bootHold: true });
    }
    if (options.defaultModel !== undefined && !this.slots.has(options.defaultModel)) invalidArgument('defaultModel', 'one of the engines', options.defaultModel);
    this.executor = new SwapExecutor(options, this.slots, this.metrics, this, () => this.closed, () => this.states());
    if (options.neighbour) this.executor.neighbour = new NeighbourParking(options.neighbour, this.registry, this);
  }

  /**
   * Reads every engine's state, suspends what does not fit, wakes the pinned engines and the
   * default model, and starts the idle timer.
   */
  static async create(options: SwapControllerOptions): Promise<SwapController> {
    const c = new SwapController(options);
    await c.executor.serial(() => Promise.all([...c.slots.values()].filter((slot) => !slot.bootHold).map((slot) => c.executor.readState(slot))));
    await c.executor.settle();
    c.executor.changed();
    c.timer = setInterval(() => c.executor.pump(), 1000);
    c.timer.unref();
    return c;
  }

  /** Every engine's state. */
  states(): EngineView[] {
    return [...this.slots.values()].map((s) => {
      const held = this.executor.residentBytes(s);
      const parked = this.executor.neighbour?.bytesOf(s.spec.name) ?? 0;
      return {
        name: s.spec.name,
        state: s.state,
        leases: s.leases - (s.bootHold ? 1 : 0), // the boot's hold is no request
        waiting: s.waiters.length,
        lastUsed: s.lastUsed,
        pinned: s.spec.pinned ?? false,
        ...(s.error ? { error: s.error } : {}),
        ...(s.damage ? { snapshotProblem: s.damage.reason } : {}),
        ...(held > 0 ? { weightsHeldBytes: held } : {}),
        ...(s.recovery ? { recovery: { ...s.recovery } } : {}),
        ...(parked > 0 ? { neighbourBytes: parked } : {}),
      };
    });
  }

  /** GPU memory accounted to the engines now (tier-0 weights and the neighbour tier's parked weights included), per device. */
  usage(): Record<number, number> {
    return usage(this.executor.planInput());
  }

  /** The neighbour tier's state (undefined without one). */
  neighbour(): NeighbourView | undefined {
    return this.executor.neighbour?.view();
  }

  /** The model names served. */
  models(): string[] {
    return [...this.slots.keys()];
  }

  /** The engine of a model (throws E_UNKNOWN_MODEL). */
  engine(name: string): SwapEngine {
    return this.slot(name).spec;
  }

  /**
   * A lease on the engine serving `model`, once it is awake (woken if needed). Rejects with
   * E_UNKNOWN_MODEL, E_BUSY (its queue is full, or it cannot fit), E_NOT_RESTORABLE (its snapshot
   * cannot bring it back), E_TIMEOUT or E_ABORTED; a failed restore rejects with a short message
   * (the full error goes to `swapFailed`).
   */
  acquire(model: string, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<Lease> {
    if (this.closed) return Promise.reject(new VsnapError('E_CLOSED', 'the SwapController was closed'));
    let slot: Slot;
    try {
      slot = this.slot(model);
    } catch (err) {
      return Promise.reject(err);
    }
    if (slot.state === 'awake' && slot.waiters.length === 0) {
      this.metrics.requests.inc({ engine: model, result: 'hit' });
      return Promise.resolve(this.executor.lease(slot));
    }
    const limit = this.options.queueLimit ?? 64;
    if (slot.waiters.length >= limit) {
      this.metrics.requests.inc({ engine: model, result: 'busy' });
      return Promise.reject(new VsnapError('E_BUSY', `${limit} requests already wait for '${model}' to wake; retry later`, { engine: model, queueLimit: limit }));
    }
    if (options.signal?.aborted) return Promise.reject(abortError(options.signal, `waiting for '${model}'`));
    return new Promise<Lease>((resolve, reject) => {
      const timeoutMs = options.timeoutMs ?? this.options.queueTimeoutMs ?? 120_000;
      const done = (): void => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        const i = slot.waiters.indexOf(waiter);
        if (i >= 0) slot.waiters.splice(i, 1);
        this.metrics.queueDepth.set({ engine: model }, slot.waiters.length);
      };
      const timer = setTimeout(() => {
        done();
        this.metrics.requests.inc({ engine: model, result: 'timeout' });
        reject(new VsnapError('E_TIMEOUT', `'${model}' did not wake within ${timeoutMs} ms`, { engine: model, timeoutMs }));
        this.executor.pump(); // what it waited for may no longer be needed
      }, timeoutMs);
      const onAbort = (): void => {
        done();
        reject(abortError(options.signal, `waiting for '${model}'`));
        this.executor.pump();
      };
      const waiter: Waiter = {
        since: Date.now(),
        resolve: (lease) => {
          done();
          this.metrics.requests.inc({ engine: model, result: 'woken' });
          resolve(lease);
        },
        reject: (err) => {
          done();
          reject(err);
        },
      };
      options.signal?.addEventListener('abort', onAbort, { once: true });
      slot.waiters.push(waiter);
      this.metrics.queueDepth.set({ engine: model }, slot.waiters.length);
      this.executor.pump();
    });
  }

  /** Wakes an engine now (suspending others as needed) and waits until it is awake. */
  async restore(model: string): Promise<void> {
    (await this.acquire(model)).release();
  }

  /**
   * Suspends an engine now, if no request uses it; it waits for a swap in progress to finish
   * first. Refuses with E_NOT_RESTORABLE when no snapshot can bring it back (unless
   * `captureIfNeeded`), E_BUSY while it is in use or requests wait for it. With
   * `keepWeightsInEngine` (vLLM with `release_kv_cache_memory`), the engine pauses and frees only
   * its KV cache, no snapshot needed; it still counts as awake in the budget and is never demoted
   * by the controller: use it for an engine that keeps its GPU (see engines/vllm/README.md).
   */
  async suspend(model: string, options: { captureIfNeeded?: boolean; keepWeightsInEngine?: boolean } = {}): Promise<SwapEvent | undefined> {
    const slot = this.slot(model);
    try {
      return await this.executor.serial(async () => {
        if (slot.state === 'failed') await this.executor.readState(slot);
        if (slot.state === 'asleep') return undefined;
        if (slot.state !== 'awake' || slot.leases > 0 || slot.waiters.length > 0) {
          const what = slot.leases > 0 ? `serving ${slot.leases} request(s)` : slot.waiters.length > 0 ? `wanted by ${slot.waiters.length} request(s)` : slot.state;
          throw new VsnapError('E_BUSY', `'${model}' is ${what}; retry when it is idle`, { engine: model });
        }
        if (options.keepWeightsInEngine) return this.executor.keepInEngine(slot);
        return this.executor.suspend(slot, options.captureIfNeeded ?? false, this.executor.mayKeepResident(slot));
      });
    } finally {
      this.executor.pump();
    }
  }

  /**
   * Re-reads an engine's state (after its process was restarted, say: it comes back awake) and
   * suspends what no longer fits.
   */
  async resync(model: string): Promise<void> {
    const slot = this.slot(model);
    await this.executor.serial(async () => {
      await this.executor.readState(slot);
      if (slot.state !== 'failed') slot.lastUsed = Date.now();
      this.executor.changed();
    });
    try {
      await this.executor.settle();
    } finally {
      this.executor.pump();
    }
  }

  /**
   * @internal The boot of an engine named in {@link SwapControllerOptions.booting} is over (it
   * succeeded or not): its state is read and it is managed from now on. Idempotent.
   */
  async releaseBootHold(model: string): Promise<void> {
    const slot = this.slot(model);
    const held = await this.executor.serial(async () => {
      if (!slot.bootHold) return false;
      delete slot.bootHold;
      slot.leases = Math.max(0, slot.leases - 1);
      return true;
    });
    if (held) await this.resync(model);
  }

  /**
   * Whether an engine's snapshot can bring its weights back, and if not, why: a snapshot marked
   * damaged by a failed restore, else the check {@link suspendEngine} makes. Problems are short.
   */
  async snapshotStatus(model: string): Promise<{ restorable: boolean; cached: boolean; problems: string[] }> {
    const slot = this.slot(model);
    const current = await this.options.store.current(slot.spec.snapshot);
    if (slot.damage && (slot.damage.snapshotId === undefined || slot.damage.snapshotId === current?.id)) {
      return { restorable: false, cached: current !== undefined, problems: [slot.damage.reason] };
    }
    if (slot.state !== 'awake' && slot.state !== 'asleep') return { restorable: false, cached: current !== undefined, problems: [`the engine is ${slot.state}`] };
    return restorableFor(this.options.store, slot.spec.snapshot, slot.spec.client);
  }

  /**
   * Re-hashes every blob of an engine's current snapshot: a snapshot that passes is no longer
   * marked damaged (after its blobs were repaired, say); one that fails is marked.
   */
  async verifySnapshot(model: string): Promise<VerifyReport> {
    const slot = this.slot(model);
    const snapshot = await Snapshot.open(this.options.store, slot.spec.snapshot);
    const report = await snapshot.verify();
    await this.executor.serial(async () => {
      if (report.ok) delete slot.damage;
      else slot.damage = { snapshotId: snapshot.id, reason: `its snapshot (capture ${snapshot.id}) failed verification: ${report.problems.length} problem(s)` };
      this.executor.changed();
    });
    this.executor.pump();
    return report;
  }

  /** Stops the timers and rejects every waiting request (E_CLOSED). Engines are left as they are; a neighbour tier the controller made is freed. */
  close(): void {
    this.closed = true;
    this.executor.neighbour?.close();
    if (this.timer) clearInterval(this.timer);
    for (const slot of this.slots.values()) {
      for (const w of [...slot.waiters]) w.reject(new VsnapError('E_CLOSED', 'the SwapController was closed'));
    }
  }

  private slot(name: string): Slot {
    const slot = this.slots.get(name);
    if (!slot) throw new VsnapError('E_UNKNOWN_MODEL', `no engine serves '${name}' (serving: ${[...this.slots.keys()].join(', ')})`, { model: name });
    return slot;
  }
}
