import { EventEmitter } from 'node:events';

import type { Registry } from 'prom-client';

import { VsnapError } from '../errors.js';
import { restorableFor } from '../flows/index.js';
import { checkOptions } from '../options.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { VerifyReport } from '../store/region-store.js';
import { SwapContext } from './context.js';
import type { SwapControllerEvents } from './events.js';
import { SwapExecutor } from './executor.js';
import { SwapMetrics } from './metrics.js';
import { resolveOptions, type SwapConfig } from './options.js';
import { usage } from './planner.js';
import { bootHeld, bootReleased, engineState, newSlot, type Slot } from './state.js';
import type { EngineView, Lease, NeighbourView, SwapControllerOptions, SwapEngine, SwapEvent, SwapHooks } from './types.js';

export type * from './types.js';
export type * from './events.js';

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
 * wanted. Its events are typed ({@link SwapControllerEvents}: `swap`, `swapFailed`, `change`, …);
 * it exports Prometheus metrics ({@link SwapController.registry}). Close it (`await close()`, or
 * `await using`) to stop it: the swap in flight finishes first.
 * @public
 */
export class SwapController extends EventEmitter<SwapControllerEvents> {
  /** The Prometheus registry with the controller's metrics ({@link SwapControllerOptions.metrics}, else its own). */
  readonly registry: Registry;
  private readonly config: SwapConfig;
  private readonly slots: ReadonlyMap<string, Slot>;
  private readonly ctx: SwapContext;
  private readonly executor: SwapExecutor;

  private constructor(options: SwapControllerOptions, seams: SwapHooks) {
    super();
    this.config = resolveOptions(options, seams);
    const metrics = new SwapMetrics(this.config.metrics);
    this.registry = metrics.registry;
    this.slots = new Map(
      this.config.engines.map((spec) => {
        const slot = newSlot(spec);
        if (this.config.booting.has(spec.name)) bootHeld(slot);
        return [spec.name, slot];
      }),
    );
    this.ctx = new SwapContext(this.config, this.slots, metrics, this);
    this.executor = new SwapExecutor(this.ctx);
  }

  /**
   * Reads every engine's state, suspends what does not fit, wakes the pinned engines and the
   * default model, and starts the idle timer. Refuses options it does not know (E_INVALID_ARGUMENT).
   */
  static create(options: SwapControllerOptions): Promise<SwapController> {
    return SwapController.createWith(options, {});
  }

  /** {@link SwapController.create} with test seams (a fake process checkpoint driver). @internal */
  static async createWith(options: SwapControllerOptions, seams: SwapHooks): Promise<SwapController> {
    const c = new SwapController(options, seams);
    try {
      await c.executor.start();
    } catch (err) {
      await c.close();
      throw err;
    }
    return c;
  }

  /** Every engine's state. */
  states(): EngineView[] {
    return this.ctx.views();
  }

  /** GPU memory accounted to the engines now (tier-0 weights and the neighbour tier's parked weights included), per device. */
  usage(): Record<number, number> {
    return usage(this.ctx.planInput());
  }

  /** The neighbour tier's state (undefined without one). */
  neighbour(): NeighbourView | undefined {
    return this.ctx.neighbour?.view();
  }

  /** The model names served. */
  models(): string[] {
    return [...this.slots.keys()];
  }

  /** The engine of a model, as configured, defaults filled in (throws E_UNKNOWN_MODEL). Where it runs now is {@link EngineView.devices}. */
  engine(name: string): SwapEngine {
    return this.slot(name).spec;
  }

  /**
   * A lease on the engine serving `model`, once it is awake (woken if needed). Rejects with
   * E_UNKNOWN_MODEL, E_BUSY (its queue is full, or it cannot fit), E_NOT_RESTORABLE (its snapshot
   * cannot bring it back), E_TIMEOUT, E_ABORTED or E_CLOSED; a failed restore rejects with a short
   * message (the full error goes to `swapFailed`).
   */
  acquire(model: string, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<Lease> {
    if (this.executor.closed) return Promise.reject(new VsnapError('E_CLOSED', 'the SwapController was closed'));
    let slot: Slot;
    try {
      checkOptions('acquire options', options, ['signal', 'timeoutMs']);
      slot = this.slot(model);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.executor.acquire(slot, options);
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
    checkOptions('suspend options', options, ['captureIfNeeded', 'keepWeightsInEngine']);
    return this.executor.suspendNow(this.slot(model), options);
  }

  /**
   * @internal The boot of an engine named in {@link SwapControllerOptions.booting} is over (it
   * succeeded or not): its state is read and it is managed from now on. Idempotent.
   */
  async releaseBootHold(model: string): Promise<void> {
    const slot = this.slot(model);
    if (await this.executor.serial(async () => bootReleased(slot))) await this.resync(model);
  }

  /**
   * Re-reads an engine's state (after its process was restarted, say: it comes back awake) and
   * suspends what no longer fits.
   */
  async resync(model: string): Promise<void> {
    await this.executor.resync(this.slot(model));
  }

  /**
   * Whether an engine's snapshot can bring its weights back, and if not, why: a snapshot marked
   * damaged by a failed restore, else the check `suspendEngine` makes. Problems are short.
   */
  async snapshotStatus(model: string): Promise<{ restorable: boolean; cached: boolean; problems: string[] }> {
    const slot = this.slot(model);
    const current = await this.config.store.current(slot.spec.snapshot);
    const damage = slot.snapshot.damage;
    if (damage && (damage.snapshotId === undefined || damage.snapshotId === current?.id)) {
      return { restorable: false, cached: current !== undefined, problems: [damage.reason] };
    }
    const state = engineState(slot.state);
    if (state !== 'awake' && state !== 'asleep') return { restorable: false, cached: current !== undefined, problems: [`the engine is ${state}`] };
    return restorableFor(this.config.store, slot.spec.snapshot, slot.spec.client);
  }

  /**
   * Re-hashes every blob of an engine's current snapshot: a snapshot that passes is no longer
   * marked damaged (after its blobs were repaired, say); one that fails is marked.
   */
  async verifySnapshot(model: string): Promise<VerifyReport> {
    const slot = this.slot(model);
    const snapshot = await Snapshot.open(this.config.store, slot.spec.snapshot);
    const report = await snapshot.verify();
    await this.executor.verified(slot, snapshot.id, report);
    return report;
  }

  /**
   * Stops the controller: the idle timer stops, waiting requests and every later call are refused
   * (E_CLOSED), and no swap starts; the one in flight finishes (a swap is never cut in half), as do
   * the background captures after recoveries; then the neighbour tier the controller made is
   * freed. Engines are left as they are. Idempotent: a second call returns the same promise.
   */
  close(): Promise<void> {
    return this.executor.close();
  }

  /** {@link SwapController.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  private slot(name: string): Slot {
    const slot = this.slots.get(name);
    if (!slot) throw new VsnapError('E_UNKNOWN_MODEL', `no engine serves '${name}' (serving: ${[...this.slots.keys()].join(', ')})`, { model: name });
    return slot;
  }
}
