import type { EventEmitter } from 'node:events';

import { engineControl } from '../engine/control.js';
import { toVsnapError, VsnapError } from '../errors.js';
import { suspendEngine, restoreEngine, type EngineRestoreReport, type SnapshotRef } from '../flows/index.js';
import { checkResident } from '../cache/resident-weights.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { Lease, RecoveryView, SwapControllerOptions, SwapEngine, SwapEvent } from './controller.js';
import type { SwapMetrics } from './metrics.js';
import { mayKeepResident, plan, type Action, type EngineState, type PlanEngine, type PlanInput } from './planner.js';
import { checkRestorable, damageReason, SNAPSHOT_FAULTS, type Damage } from './readiness.js';
import type { NeighbourParking } from './neighbour-parking.js';

/** A request waiting for its engine. @internal */
export interface Waiter {
  resolve: (lease: Lease) => void;
  reject: (err: VsnapError) => void;
  since: number;
}

/** One engine's live state. @internal */
export interface Slot {
  spec: SwapEngine & { snapshot: string; devices: readonly number[]; asleepBytes: number };
  state: EngineState;
  leases: number;
  lastUsed: number;
  waiters: Waiter[];
  error?: string;
  /** Its snapshot cannot bring it back (until re-captured or verified). */
  damage?: Damage;
  /** After a failed swap: left alone in the background until then. */
  retryAt?: number;
  /** Suspended by the engine itself with its weights kept (suspend's keepWeightsInEngine). */
  keptByEngine?: boolean;
  /** A deepSuspend engine asleep at level 2 only (its deep step failed): it holds its asleepBytes. */
  shallow?: boolean;
  /** Its tier-0 weights failed the dirty check before a demotion: kept, never demoted. */
  holdLocked?: boolean;
  /** Its last recovery through the engine's own loader. */
  recovery?: { -readonly [K in keyof RecoveryView]: RecoveryView[K] };
  /** The background capture after a recovery (materialize `async`): a suspend waits for it. */
  materializing?: Promise<void>;
  /** Its snapshot's largest rank, in bytes (read at the restorability check): its weights for an overlapped swap. */
  snapshotWeightsBytes?: number;
  /** In an overlapped swap, until the other engine sleeps: what it holds per device (asleep, plus its woken weights), counted instead of memoryBytes. */
  swapHolding?: number;
  /** vsnap serve is booting it (SwapControllerOptions.booting): counted awake, one lease, until released. */
  bootHold?: boolean;
}

/** How long an engine whose swap failed is left alone by background steps (pinned, default, TTL, budget). */
const RETRY_MS = 10_000;

/**
 * The one place where the controller's state changes under concurrency: every mutation (the
 * planner's steps, manual suspends, resyncs) runs through `serial`, one at a time, so no two steps
 * ever overlap (a compound `swap` step runs its suspend and its restore at once, as one step) and a
 * decision is never made on a state another step is changing. After any failed
 * step the engine's real state is read back instead of assumed.
 * @internal
 */
export class SwapExecutor {
  private queue: Promise<unknown> = Promise.resolve();
  private pumpQueued = false;
  /** Engines whose snapshot was checked restorable for the bring-up now in progress. */
  private readonly checked = new Set<Slot>();
  /** The neighbour-GPU tier, when configured (set by the controller). */
  neighbour: NeighbourParking | undefined;

  constructor(
    private readonly options: SwapControllerOptions,
    private readonly slots: ReadonlyMap<string, Slot>,
    private readonly metrics: SwapMetrics,
    private readonly events: EventEmitter,
    private readonly isClosed: () => boolean,
    private readonly views: () => unknown,
  ) {}

  /** Runs `job` after every job queued before it (and before any queued after). */
  serial<T>(job: () => Promise<T>): Promise<T> {
    const run = this.queue.then(job);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Queues one planning step (at most one is queued at a time; each step queues the next). */
  pump(): void {
    if (this.pumpQueued || this.isClosed()) return;
    this.pumpQueued = true;
    void this.serial(async () => {
      this.pumpQueued = false;
      if (this.isClosed()) return; // no swap starts after close()
      if (await this.step()) this.pump();
    });
  }

  /** Takes steps until nothing is left to do now; throws E_BUSY when a device stays over budget. */
  async settle(): Promise<void> {
    for (;;) {
      const action = await this.serial(async () => {
        const next = plan(this.planInput());
        if (next.kind === 'overBudget') return next;
        return (await this.step()) ? undefined : next;
      });
      if (action?.kind === 'overBudget') throw new VsnapError('E_BUSY', action.message, { device: action.device });
      if (action) return;
    }
  }

  planInput(): PlanInput {
    const engines: PlanEngine[] = [...this.slots.values()].map((s) => ({
      name: s.spec.name,
      state: s.state,
      leases: s.leases,
      waitingSince: s.waiters[0]?.since,
      lastUsed: s.lastUsed,
      pinned: s.spec.pinned ?? false,
      devices: s.spec.devices,
      memoryBytes: s.swapHolding ?? s.spec.memoryBytes,
      asleepBytes: s.spec.deepSuspend && !s.shallow ? 0 : s.spec.asleepBytes,
      residentBytes: this.residentBytes(s),
      weightsBytes: s.spec.deepSuspend ? undefined : s.spec.weightsBytes, // tier 0 never holds a deep engine's weights
      group: s.spec.group,
      idleTtlMs: s.spec.idleTtlMs,
      unrestorable: this.recovers() ? undefined : s.damage?.reason, // with recovery, a bad snapshot is reloaded past
      retryAt: s.retryAt,
      keptByEngine: s.keptByEngine,
      holdLocked: s.holdLocked,
      movableTo: s.spec.deepSuspend && !s.shallow ? s.spec.movableTo : undefined,
      swapWeightsBytes: s.spec.deepSuspend ? undefined : (s.spec.weightsBytes ?? s.snapshotWeightsBytes),
    }));
    return {
      engines, budgets: this.options.budgets, defaultModel: this.options.defaultModel, tier0: this.options.resident !== undefined, now: Date.now(), overlap: this.overlaps(),
      ...(this.neighbour ? { neighbour: this.neighbour.plan() } : {}),
    };
  }

  /** Whether swaps overlap (SwapControllerOptions.overlap). */
  private overlaps(): boolean {
    return this.options.overlap ?? true;
  }

  /** Whether restores recover through the engine's own loader when the snapshot cannot be used. */
  private recovers(): boolean {
    return (this.options.recovery ?? 'reload') === 'reload';
  }

  /** Tier-0 bytes kept for a suspended engine, per device. */
  residentBytes(slot: Slot): number {
    const e = this.options.resident?.peek(slot.spec.client.baseUrl);
    return e ? (slot.spec.weightsBytes ?? e.bytes / slot.spec.devices.length) : 0;
  }

  /** Plans and takes one step; false when there is nothing to do now. */
  private async step(): Promise<boolean> {
    const action = plan(this.planInput());
    // A refusal for a known-damaged snapshot is checked again too: a new capture clears it.
    const recheck = action.kind === 'reject' && action.code === 'E_NOT_RESTORABLE';
    const target = action.kind === 'swap' ? action.wake : action.kind === 'wake' || recheck ? action.engine : action.kind === 'suspend' || action.kind === 'demote' ? action.for : undefined;
    if (target !== undefined) {
      // Before anyone is suspended for it (or it is woken), make sure its snapshot can bring it back.
      const slot = this.slots.get(target)!;
      if (!this.checked.has(slot)) {
        await this.check(slot);
        return true; // plan again: the state may have changed meanwhile
      }
    }
    return this.take(action);
  }

  private async take(action: Action): Promise<boolean> {
    switch (action.kind) {
      case 'grant': {
        const slot = this.slots.get(action.engine)!;
        this.checked.delete(slot);
        for (const w of slot.waiters.splice(0)) w.resolve(this.lease(slot));
        this.metrics.queueDepth.set({ engine: slot.spec.name }, 0);
        return true;
      }
      case 'wake':
        await this.wake(this.slots.get(action.engine)!, action.onto);
        return true;
      case 'suspend':
        try {
          await this.suspend(this.slots.get(action.engine)!, this.options.captureIfNeeded ?? true, action.keepResident, action.for);
        } catch (err) {
          // No room was made: the requests it was for learn why now rather than at their timeout.
          const target = action.for === undefined ? undefined : this.slots.get(action.for);
          const e = toVsnapError(err);
          if (target) this.rejectWaiters(target, new VsnapError(e.code, `'${target.spec.name}' could not be given room: suspending '${action.engine}' failed (${e.code}). Retry later.`, { engine: target.spec.name }, { cause: e }));
        }
        return true;
      case 'demote':
        await this.demote(this.slots.get(action.engine)!);
        return true;
      case 'swap': {
        // swapEngines' `weights`, as two steps run at once: the restore's KV cache wakes once the
        // suspend is done; a failed suspend fails the restore (back to sleep, its waiters told).
        const b = this.slots.get(action.wake)!;
        // Until the other engine sleeps, b is accounted with its weights only (what the planner checked).
        const weights = b.spec.weightsBytes ?? b.snapshotWeightsBytes ?? 0;
        b.swapHolding = Math.max(b.spec.asleepBytes + this.residentBytes(b), b.spec.asleepBytes + weights);
        const suspending = this.suspend(this.slots.get(action.suspend)!, this.options.captureIfNeeded ?? true, action.keepResident, action.wake);
        const slept = suspending.then(() => void delete b.swapHolding);
        slept.catch(() => undefined);
        try {
          await Promise.all([this.wake(b, undefined, { victim: action.suspend, slept }), suspending.catch(() => undefined)]);
        } finally {
          delete b.swapHolding;
        }
        this.changed();
        return true;
      }
      case 'evictParked':
        this.neighbour?.evict(action.id, action.for === undefined ? 'budget' : 'room', action.for);
        this.changed();
        return true;
      case 'reject': {
        const slot = this.slots.get(action.engine)!;
        this.checked.delete(slot);
        const err = new VsnapError(action.code, action.code === 'E_NOT_RESTORABLE' ? `${action.message}. Re-capture its snapshot, or repair it and verify it.` : action.message, { engine: action.engine });
        this.rejectWaiters(slot, err);
        return true;
      }
      case 'idle':
        this.checked.clear();
        return false;
      default:
        return false; // wait (a release or a new request pumps again), overBudget, idle
    }
  }

  private async check(slot: Slot): Promise<void> {
    if (slot.state === 'failed' && (await this.readState(slot)) === 'failed') {
      // Nothing is suspended for an engine that does not answer.
      this.rejectWaiters(slot, new VsnapError('E_ENGINE_UNREACHABLE', `the engine of '${slot.spec.name}' does not answer; retry later`, { engine: slot.spec.name }));
      return;
    }
    if (slot.state === 'awake') return;
    if (slot.keptByEngine) {
      this.checked.add(slot); // the engine kept its weights: it resumes without a snapshot
      return;
    }
    try {
      const found = await checkRestorable({
        store: this.options.store,
        name: slot.spec.snapshot,
        engineKey: slot.spec.client.baseUrl,
        cache: this.options.cache,
        resident: this.options.resident,
        known: slot.damage,
      });
      if (found.damage) this.markDamaged(slot, found.damage, found.detail);
      else delete slot.damage;
      if (this.overlaps() && slot.spec.weightsBytes === undefined && !found.damage) slot.snapshotWeightsBytes = await this.snapshotWeights(slot);
      this.checked.add(slot);
    } catch (err) {
      const e = toVsnapError(err); // the store failed (not the snapshot): tell the waiters, try again later
      this.events.emit('swapFailed', { engine: slot.spec.name, action: 'restore', error: e });
      this.rejectWaiters(slot, new VsnapError(e.code, `'${slot.spec.name}' could not be checked for a restore (${e.code}); retry later`, { engine: slot.spec.name }, { cause: e }));
    }
  }

  /** The largest rank of its current snapshot, in bytes (undefined when it cannot be read: no overlap then). */
  private async snapshotWeights(slot: Slot): Promise<number | undefined> {
    const manifest = await this.options.store.current(slot.spec.snapshot).catch(() => undefined);
    if (!manifest) return undefined;
    return Math.max(0, ...manifest.data.ranks.map((r) => r.regions.reduce((n, x) => n + x.size, 0)));
  }

  private markDamaged(slot: Slot, damage: Damage, detail: string | undefined): void {
    const fresh = slot.damage?.reason !== damage.reason;
    slot.damage = damage;
    if (fresh) {
      this.events.emit('snapshotDamaged', { engine: slot.spec.name, snapshotId: damage.snapshotId, reason: damage.reason, detail });
      this.changed();
    }
  }

  private rejectWaiters(slot: Slot, err: VsnapError): void {
    for (const w of slot.waiters.splice(0)) w.reject(err);
    this.metrics.queueDepth.set({ engine: slot.spec.name }, 0);
  }

  /** Reads whether an engine is awake or asleep (through its vsnap routes, or the dev routes). */
  async readState(slot: Slot): Promise<EngineState> {
    try {
      slot.state = (await engineControl(slot.spec.client)).status.sleeping ? 'asleep' : 'awake';
      if (slot.state === 'awake') delete slot.keptByEngine;
      delete slot.error;
    } catch (err) {
      slot.state = 'failed';
      slot.error = (err as Error).message;
    }
    return slot.state;
  }

  lease(slot: Slot): Lease {
    slot.leases++;
    slot.lastUsed = Date.now();
    let released = false;
    return {
      engine: slot.spec.name,
      client: slot.spec.client,
      release: () => {
        if (released) return;
        released = true;
        slot.leases--;
        slot.lastUsed = Date.now();
        this.pump();
      },
    };
  }

  changed(): void {
    this.metrics.awake.set([...this.slots.values()].filter((s) => s.state === 'awake').length);
    this.events.emit('change', this.views());
  }

  /** Wakes it; `onto`: a deep-suspended engine's process is restored onto that GPU first. */
  private async wake(slot: Slot, onto?: readonly number[], room?: { victim: string; slept: Promise<void> }): Promise<void> {
    this.checked.delete(slot);
    const name = slot.spec.name;
    const started = performance.now();
    slot.state = 'waking';
    this.changed();
    this.events.emit('swapStarted', { engine: name, action: 'restore' });
    let snapshotId: string | undefined;
    try {
      const report = slot.keptByEngine ? await this.resumeKept(slot) : await this.restore(slot, (id) => (snapshotId = id), onto, room ? () => room.slept : undefined);
      if (onto) slot.spec = { ...slot.spec, devices: onto }; // it runs there now
      delete slot.keptByEngine;
      delete slot.holdLocked;
      slot.state = 'awake';
      slot.lastUsed = Date.now();
      delete slot.error;
      delete slot.retryAt;
      if (!('path' in report) || report.path === 'restored') delete slot.recovery;
      // a snapshot the store lacked was pulled from its registry by this restore: no longer missing
      if (slot.spec.from && slot.damage?.snapshotId === undefined && 'path' in report && report.path === 'restored') delete slot.damage;
      const event: SwapEvent = { engine: name, action: 'restore', seconds: (performance.now() - started) / 1000, phases: report.phases, tier: report.tier, ...('recovery' in report && report.recovery ? { recovered: report.recovery.reason } : {}), ...('multipath' in report && report.multipath ? { bytesViaNeighbour: report.multipath.bytesNeighbour } : {}) };
      if ('recovery' in report && report.recovery) this.recovered(slot, report as EngineRestoreReport, event.seconds);
      this.metrics.swaps.inc({ engine: name, action: 'restore', result: 'ok' });
      this.metrics.swapSeconds.observe({ engine: name, action: 'restore', tier: report.tier }, event.seconds);
      this.metrics.bytesMoved.inc({ engine: name }, report.bytes);
      if (report.tier === 'neighbour') this.neighbour?.hit(name);
      this.changed();
      this.events.emit('swap', event);
    } catch (err) {
      const e = toVsnapError(err);
      this.metrics.swaps.inc({ engine: name, action: 'restore', result: 'error' });
      // In an overlapped swap whose suspend failed, the restore was called off: no fault of this engine.
      const roomError = room ? await room.slept.then(() => undefined, (x: unknown) => toVsnapError(x)) : undefined;
      if (!roomError) slot.retryAt = Date.now() + RETRY_MS;
      if (slot.spec.deepSuspend && 'recovered' in e.details) {
        // The processes were restored (and moved, with onto) before a later step failed: the
        // engine is no longer deep, it holds its context (asleepBytes) where it runs now.
        slot.shallow = true;
        if (onto) slot.spec = { ...slot.spec, devices: onto };
      }
      // A failed recovery (details.recovery) still says the snapshot was bad (details.snapshotError).
      const fault = SNAPSHOT_FAULTS.has(e.code) ? e.code : (e.details.snapshotError as VsnapError['code'] | undefined);
      if (fault !== undefined && SNAPSHOT_FAULTS.has(fault)) this.markDamaged(slot, { snapshotId, reason: damageReason(fault, snapshotId) }, e.message);
      if (typeof e.details.recovery === 'string') this.metrics.recoveries.inc({ engine: name, reason: e.details.recovery, result: 'error' });
      // What the engine really is now. Awake after a failed restore means its weights are not
      // the verified ones (it could not be put back to sleep): never lease it.
      const now = await this.readState(slot);
      if (now === 'awake' || e.details.recovered === false) slot.state = 'failed';
      slot.error = e.message;
      this.changed();
      this.events.emit('swapFailed', { engine: name, action: 'restore', error: e });
      // Clients get a short answer; the operator's detail (paths, mismatches) is the event's error.
      const message = slot.damage
        ? `'${name}' cannot be restored: ${slot.damage.reason}. Re-capture its snapshot, or repair it and verify it.`
        : roomError
          ? `'${name}' could not be given room: suspending '${room!.victim}' failed (${roomError.code}). Retry later.`
          : `the restore of '${name}' failed (${e.code}); the engine is ${slot.state}. Retry later.`;
      this.rejectWaiters(slot, new VsnapError(slot.damage ? 'E_NOT_RESTORABLE' : (roomError?.code ?? e.code), message, { engine: name }, { cause: e }));
    }
  }

  private async restore(slot: Slot, opened: (id: string) => void, onto?: readonly number[], beforeKvWake?: () => Promise<void>) {
    const recovery = this.recovers() ? ('reload' as const) : ('fail' as const);
    let source: Snapshot | SnapshotRef;
    try {
      const snapshot = await Snapshot.open(this.options.store, slot.spec.snapshot);
      opened(snapshot.id);
      source = snapshot;
    } catch (err) {
      if (recovery === 'fail') throw err;
      // restoreEngine opens it again (pulling it first when it has a registry source) and recovers past it
      source = { store: this.options.store, name: slot.spec.snapshot, ...(slot.spec.from ? { from: slot.spec.from } : {}) };
    }
    const tiers = {
      ...(this.options.cache ? { ram: this.options.cache } : {}),
      ...(this.options.resident ? { gpu: this.options.resident } : {}),
      ...(this.neighbour && !this.neighbour.tier.closed ? { neighbour: this.neighbour.tier } : {}),
      ...(this.twoLinks(slot) ? { multipath: this.options.multipath! } : {}),
    };
    const hooks = { ...(this.options.checkpointBackend ? { checkpoint: this.options.checkpointBackend } : {}), ...(beforeKvWake ? { beforeKvWake } : {}) };
    return restoreEngine(source, slot.spec.client, {
      tiers,
      ...(onto ? { move: { onto: onto[0]! } } : {}),
      recovery: { policy: recovery, materialize: this.options.materialize ?? 'async' },
      ...(this.overlaps() ? { overlapKvWake: true } : {}),
      hooks,
      onWarning: (message) => this.events.emit('warning', { engine: slot.spec.name, message }),
    });
  }

  /** Whether a restore of this engine goes over two PCIe links (SwapControllerOptions.multipath): one GPU, not the neighbour. */
  private twoLinks(slot: Slot): boolean {
    const m = this.options.multipath;
    return m !== undefined && slot.spec.devices.length === 1 && slot.spec.devices[0] !== m.neighbour;
  }

  /** Counts and reports a recovery; follows its background capture, if any. */
  private recovered(slot: Slot, report: EngineRestoreReport, seconds: number): void {
    const r = report.recovery!;
    const name = slot.spec.name;
    this.metrics.recoveries.inc({ engine: name, reason: r.reason, result: 'ok' });
    this.metrics.recoverySeconds.observe({ engine: name, reason: r.reason }, seconds);
    const state = r.materialize === 'off' ? 'off' : r.snapshot ? 'captured' : 'capturing';
    slot.recovery = { reason: r.reason, code: r.code, at: Date.now(), snapshot: state };
    if (r.snapshot) delete slot.damage; // a new capture replaced the bad one
    this.events.emit('recovered', { engine: name, reason: r.reason, code: r.code, message: r.message, seconds, expectedResponse: r.expectedResponse });
    if (r.materialized) {
      const mine = slot.recovery;
      const pending: Promise<void> = r.materialized.then((outcome) => {
        if (slot.materializing === pending) delete slot.materializing;
        if (slot.recovery === mine) mine.snapshot = outcome.ok ? 'captured' : 'failed';
        if (outcome.ok) {
          if (slot.damage?.snapshotId !== outcome.snapshot.id) delete slot.damage;
          this.events.emit('materialized', { engine: name, snapshotId: outcome.snapshot.id });
        } else {
          this.events.emit('materializeFailed', { engine: name, error: outcome.error });
        }
        this.changed();
      });
      slot.materializing = pending;
    }
  }

  /** The engine's own tier 0: wake its KV cache (no snapshot, nothing moved). */
  private async resumeKept(slot: Slot) {
    const report = await restoreEngine({ store: this.options.store, name: slot.spec.snapshot }, slot.spec.client, { tiers: { engine: true } });
    return { phases: report.phases, tier: report.tier, bytes: 0 };
  }

  /**
   * The engine's own tier 0 (vLLM's release_kv_cache_memory): the engine pauses and frees only its
   * KV cache, weights kept. It still counts as awake in the budget and is never demoted.
   */
  async keepInEngine(slot: Slot): Promise<SwapEvent> {
    const name = slot.spec.name;
    slot.state = 'suspending';
    this.changed();
    this.events.emit('swapStarted', { engine: name, action: 'suspend' });
    try {
      const r = await suspendEngine(this.options.store, slot.spec.snapshot, slot.spec.client, { tiers: { engine: true } });
      Object.assign(slot, { state: 'asleep', keptByEngine: true });
      const event: SwapEvent = { engine: name, action: 'suspend', seconds: r.seconds, captured: false };
      this.metrics.swaps.inc({ engine: name, action: 'suspend', result: 'ok' });
      this.metrics.swapSeconds.observe({ engine: name, action: 'suspend', tier: 'engine' }, event.seconds);
      this.changed();
      this.events.emit('swap', event);
      return event;
    } catch (err) {
      const e = toVsnapError(err);
      await this.readState(slot);
      slot.error = e.message;
      this.metrics.swaps.inc({ engine: name, action: 'suspend', result: 'error' });
      this.changed();
      this.events.emit('swapFailed', { engine: name, action: 'suspend', error: e });
      throw e;
    }
  }

  /**
   * Releases the weights tier 0 holds for a suspended engine, after the dirty check: the held
   * memory must still equal the snapshot that brings the engine back (a weight update racing the
   * suspend would otherwise be lost). Weights that differ, or cannot be checked, are kept: the
   * engine is marked so the planner never demotes it, and `swapFailed` says why.
   */
  private async demote(slot: Slot): Promise<void> {
    const resident = this.options.resident!;
    const entry = resident.peek(slot.spec.client.baseUrl);
    if (entry) {
      let problem: string | undefined;
      let cause: unknown;
      try {
        const snapshot = await Snapshot.open(this.options.store, slot.spec.snapshot, { id: entry.snapshotId });
        const report = await checkResident(snapshot.manifest, entry);
        if (!report.checked) problem = `snapshot ${entry.snapshotId} has no GPU digests to check them against`;
        else if (report.changed.length) problem = `they differ from snapshot ${entry.snapshotId} in ${report.changed.length} region(s): ${report.changed.slice(0, 5).join(', ')}`;
      } catch (err) {
        cause = err;
        problem = `they could not be checked against snapshot ${entry.snapshotId} (${toVsnapError(err).code})`;
      }
      if (problem !== undefined) {
        slot.holdLocked = true;
        slot.error = `tier-0 weights kept, not demoted: ${problem}`;
        const e = new VsnapError('E_STALE', `the weights tier 0 holds for '${slot.spec.name}' were not released: ${problem}. Wake it (they come back as they are), then capture it again.`, { engine: slot.spec.name }, cause === undefined ? {} : { cause });
        this.events.emit('swapFailed', { engine: slot.spec.name, action: 'demote', error: e });
        this.changed();
        return;
      }
    }
    resident.release(slot.spec.client.baseUrl);
    this.changed();
  }

  /** Suspends an engine; on failure, reads back what it really is and rethrows. */
  async suspend(slot: Slot, captureIfNeeded: boolean, keepResident: boolean, forEngine?: string): Promise<SwapEvent> {
    const name = slot.spec.name;
    // A capture after a recovery still running: let it finish, so the suspend finds its snapshot.
    if (slot.materializing) await slot.materializing;
    const started = performance.now();
    slot.state = 'suspending';
    this.changed();
    this.events.emit('swapStarted', { engine: name, action: 'suspend' });
    try {
      const resident = keepResident && !slot.spec.deepSuspend ? this.options.resident : undefined;
      // Not parked when tier 0 keeps the weights on their own GPU; else the planner decides.
      const neighbour = !resident && this.neighbour?.parkable(slot.spec.devices) ? this.neighbour.parkOptions(name, () => this.planInput(), forEngine) : undefined;
      const result = await suspendEngine(this.options.store, slot.spec.snapshot, slot.spec.client, {
        captureIfNeeded,
        tiers: { ...(this.options.cache ? { ram: this.options.cache } : {}), ...(resident ? { gpu: resident } : {}), ...(neighbour ? { neighbour } : {}) },
        ...(slot.spec.deepSuspend ? { deep: true } : {}),
        ...(this.options.checkpointBackend ? { hooks: { checkpoint: this.options.checkpointBackend } } : {}),
        ...(slot.spec.check ? { capture: { check: slot.spec.check } } : {}),
        ...(neighbour ? { onWarning: (message: string) => this.events.emit('warning', { engine: name, message }) } : {}),
      });
      this.neighbour?.parked(name, result.parked, result.snapshot!.id);
      slot.state = 'asleep';
      delete slot.shallow;
      delete slot.retryAt;
      if (result.captured) delete slot.damage; // a new capture: whatever was wrong with the old one is gone
      const event: SwapEvent = { engine: name, action: 'suspend', seconds: (performance.now() - started) / 1000, captured: result.captured };
      this.metrics.swaps.inc({ engine: name, action: 'suspend', result: 'ok' });
      this.metrics.swapSeconds.observe({ engine: name, action: 'suspend', tier: resident ? 'gpu' : 'store' }, event.seconds);
      this.changed();
      this.events.emit('swap', event);
      return event;
    } catch (err) {
      const e = toVsnapError(err);
      await this.readState(slot); // refused, failed half way, or the answer was lost: ask the engine
      // a failed deep step rolls back to a level-2 sleep: the engine holds its context again
      if (slot.spec.deepSuspend && slot.state === 'asleep') slot.shallow = true;
      slot.error = e.message;
      slot.retryAt = Date.now() + RETRY_MS;
      this.metrics.swaps.inc({ engine: name, action: 'suspend', result: 'error' });
      this.changed();
      this.events.emit('swapFailed', { engine: name, action: 'suspend', error: e });
      throw e;
    }
  }

  /** Whether suspending `slot` now may keep its weights in tier 0. */
  mayKeepResident(slot: Slot): boolean {
    const input = this.planInput();
    return mayKeepResident(input, input.engines.find((e) => e.name === slot.spec.name)!);
  }
}
