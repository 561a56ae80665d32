import { EventEmitter } from 'node:events';

import type { Registry } from 'prom-client';

import type { HostCache } from '../cache/host-cache.js';
import type { ResidentWeights } from '../cache/resident-weights.js';
import { engineControl } from '../engine/control.js';
import type { EngineClient } from '../engine/engine-client.js';
import { abortError, invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { resumeEngineKeptWeights, suspendEngineKeepingWeights } from '../snapshot/engine-kv-release.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { RegionStore } from '../store/region-store.js';
import { SwapMetrics } from './metrics.js';

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
}

/**
 * What an engine is doing.
 * @public
 */
export type EngineState = 'awake' | 'asleep' | 'waking' | 'suspending' | 'failed';

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
  /** restore: where the weights came from (`gpu`: tier 0, nothing copied). */
  readonly tier?: 'gpu' | 'ram' | 'store';
  /** suspend: whether a snapshot was captured first. */
  readonly captured?: boolean;
}

interface Waiter {
  resolve: (lease: Lease) => void;
  reject: (err: VsnapError) => void;
  cleanup: () => void;
  since: number;
}

interface Slot {
  spec: SwapEngine & { snapshot: string; devices: readonly number[]; asleepBytes: number };
  state: EngineState;
  leases: number;
  lastUsed: number;
  waiters: Waiter[];
  error?: string;
  /** Suspended by the engine itself with its weights kept (suspend's keepWeightsInEngine). */
  keptByEngine?: boolean;
}

/**
 * Time-shares GPUs between engines: keeps awake only what fits each device's budget, wakes the
 * engine a request asks for (suspending the least recently used idle ones to make room), and
 * hands out leases so that no request ever reaches a sleeping engine. Swaps run one at a time;
 * requests for an engine being woken wait in a bounded queue. Pinned engines stay awake, idle
 * engines with a TTL are suspended, and a default model is woken when nothing else is wanted.
 * Emits `swapStarted` (with engine and action), `swap` ({@link SwapEvent}, when one finished,
 * with phase timings), `swapFailed` (with engine, action and error) and `change` (after every
 * state change); exports Prometheus metrics.
 * @public
 */
export class SwapController extends EventEmitter {
  /** The Prometheus registry with the controller's metrics. */
  readonly registry: Registry;
  private readonly options: SwapControllerOptions;
  private readonly slots = new Map<string, Slot>();
  private readonly metrics: SwapMetrics;
  private running = false;
  private released: Array<() => void> = [];
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
      for (const d of spec.devices) {
        if (options.budgets[d] === undefined) invalidArgument('budgets', `a budget for device ${d} (used by ${e.name})`, options.budgets);
      }
      this.slots.set(e.name, { spec, state: 'asleep', leases: 0, lastUsed: 0, waiters: [] });
    }
    if (options.defaultModel !== undefined && !this.slots.has(options.defaultModel)) invalidArgument('defaultModel', 'one of the engines', options.defaultModel);
  }

  /**
   * Reads every engine's state, suspends what does not fit, wakes the pinned engines and the
   * default model, and starts the idle timer.
   */
  static async create(options: SwapControllerOptions): Promise<SwapController> {
    const c = new SwapController(options);
    await Promise.all([...c.slots.values()].map((slot) => c.readState(slot)));
    await c.fitToBudget();
    for (const slot of c.slots.values()) if (slot.spec.pinned && slot.state === 'asleep') await c.bringUp(slot);
    c.changed();
    c.timer = setInterval(() => c.tick(), 1000);
    c.timer.unref();
    c.tick();
    return c;
  }

  /** Every engine's state. */
  states(): EngineView[] {
    return [...this.slots.values()].map((s) => ({
      name: s.spec.name,
      state: s.state,
      leases: s.leases,
      waiting: s.waiters.length,
      lastUsed: s.lastUsed,
      pinned: s.spec.pinned ?? false,
      ...(s.error ? { error: s.error } : {}),
    }));
  }

  /** GPU memory accounted to the engines now (tier-0 weights included), per device. */
  usage(): Record<number, number> {
    const out: Record<number, number> = {};
    for (const d of Object.keys(this.options.budgets)) out[Number(d)] = 0;
    for (const s of this.slots.values()) {
      // An engine that suspended itself keeping its weights frees only its KV cache: counted as awake.
      const held = (s.state === 'asleep' || s.state === 'failed') && !s.keptByEngine ? s.spec.asleepBytes + this.residentBytes(s) : s.spec.memoryBytes;
      for (const d of s.spec.devices) out[d] = (out[d] ?? 0) + held;
    }
    return out;
  }

  /** Tier-0 bytes kept for a suspended engine, per device. */
  private residentBytes(slot: Slot): number {
    const e = this.options.resident?.peek(slot.spec.client.baseUrl);
    return e ? (slot.spec.weightsBytes ?? e.bytes / slot.spec.devices.length) : 0;
  }

  /** Whether suspending `slot` may keep its weights on the GPU (and still leave room for `next`). */
  private mayKeepResident(slot: Slot, next?: Slot): boolean {
    const weights = slot.spec.weightsBytes;
    if (!this.options.resident || weights === undefined) return false;
    const usage = this.usage();
    return slot.spec.devices.every((d) => {
      let after = (usage[d] ?? 0) - slot.spec.memoryBytes + slot.spec.asleepBytes + weights;
      if (next?.spec.devices.includes(d)) after += next.spec.memoryBytes - next.spec.asleepBytes - this.residentBytes(next);
      return after <= this.options.budgets[d]!;
    });
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
   * E_UNKNOWN_MODEL, E_BUSY (its queue is full), E_TIMEOUT or E_ABORTED.
   */
  acquire(model: string, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<Lease> {
    if (this.closed) return Promise.reject(new VsnapError('E_CLOSED', 'the SwapController was closed'));
    let slot: Slot;
    try {
      slot = this.slot(model);
    } catch (err) {
      return Promise.reject(err);
    }
    if (slot.state === 'awake') {
      this.metrics.requests.inc({ engine: model, result: 'hit' });
      return Promise.resolve(this.lease(slot));
    }
    const limit = this.options.queueLimit ?? 64;
    if (slot.waiters.length >= limit) {
      this.metrics.requests.inc({ engine: model, result: 'busy' });
      return Promise.reject(new VsnapError('E_BUSY', `${limit} requests already wait for '${model}' to wake; retry later`, { engine: model, queueLimit: limit }));
    }
    if (options.signal?.aborted) return Promise.reject(abortError(options.signal, `waiting for '${model}'`));
    return new Promise<Lease>((resolve, reject) => {
      const timeoutMs = options.timeoutMs ?? this.options.queueTimeoutMs ?? 120_000;
      const remove = (): void => {
        const i = slot.waiters.indexOf(waiter);
        if (i >= 0) slot.waiters.splice(i, 1);
        this.metrics.queueDepth.set({ engine: model }, slot.waiters.length);
      };
      const timer = setTimeout(() => {
        remove();
        this.metrics.requests.inc({ engine: model, result: 'timeout' });
        reject(new VsnapError('E_TIMEOUT', `'${model}' did not wake within ${timeoutMs} ms`, { engine: model, timeoutMs }));
      }, timeoutMs);
      const onAbort = (): void => {
        remove();
        clearTimeout(timer);
        reject(abortError(options.signal, `waiting for '${model}'`));
      };
      const waiter: Waiter = {
        since: Date.now(),
        resolve: (lease) => {
          waiter.cleanup();
          this.metrics.requests.inc({ engine: model, result: 'woken' });
          resolve(lease);
        },
        reject: (err) => {
          waiter.cleanup();
          reject(err);
        },
        cleanup: () => {
          clearTimeout(timer);
          options.signal?.removeEventListener('abort', onAbort);
        },
      };
      options.signal?.addEventListener('abort', onAbort, { once: true });
      slot.waiters.push(waiter);
      this.metrics.queueDepth.set({ engine: model }, slot.waiters.length);
      this.schedule();
    });
  }

  /** Wakes an engine now (suspending others as needed) and waits until it is awake. */
  async restore(model: string): Promise<void> {
    (await this.acquire(model)).release();
  }

  /**
   * Suspends an engine now, if no request uses it. Refuses with E_NOT_RESTORABLE when no snapshot
   * can bring it back (unless `captureIfNeeded`), E_BUSY while it is in use. With
   * `keepWeightsInEngine` (vLLM with `release_kv_cache_memory`), the engine pauses and frees only
   * its KV cache, no snapshot needed; it still counts as awake in the budget and is never demoted
   * by the controller: use it for an engine that keeps its GPU (see engines/vllm/README.md).
   */
  async suspend(model: string, options: { captureIfNeeded?: boolean; keepWeightsInEngine?: boolean } = {}): Promise<SwapEvent | undefined> {
    const slot = this.slot(model);
    if (slot.state === 'asleep') return undefined;
    if (slot.state !== 'awake' || slot.leases > 0) {
      throw new VsnapError('E_BUSY', `'${model}' is ${slot.leases > 0 ? `serving ${slot.leases} request(s)` : slot.state}; retry when it is idle`, { engine: model });
    }
    if (options.keepWeightsInEngine) return this.keepInEngine(slot);
    return this.putToSleep(slot, options.captureIfNeeded ?? false, this.mayKeepResident(slot));
  }

  /** The engine's own tier 0: pause and release the KV cache, weights kept in the engine. */
  private async keepInEngine(slot: Slot): Promise<SwapEvent> {
    slot.state = 'suspending';
    this.emit('swapStarted', { engine: slot.spec.name, action: 'suspend' });
    try {
      const r = await suspendEngineKeepingWeights(slot.spec.client);
      Object.assign(slot, { state: 'asleep', keptByEngine: true });
      const event: SwapEvent = { engine: slot.spec.name, action: 'suspend', seconds: r.seconds, captured: false };
      this.metrics.swaps.inc({ engine: slot.spec.name, action: 'suspend', result: 'ok' });
      this.changed();
      this.emit('swap', event);
      return event;
    } catch (err) {
      slot.state = 'awake';
      this.changed();
      throw toVsnapError(err);
    }
  }

  /**
   * Re-reads an engine's state (after its process was restarted, say: it comes back awake) and
   * suspends what no longer fits.
   */
  async resync(model: string): Promise<void> {
    const slot = this.slot(model);
    await this.readState(slot);
    if (slot.state !== 'failed') slot.lastUsed = Date.now();
    this.changed();
    await this.fitToBudget();
    this.schedule();
  }

  /** Reads whether an engine is awake or asleep (through its vsnap routes, or the dev routes). */
  private async readState(slot: Slot): Promise<void> {
    try {
      slot.state = (await engineControl(slot.spec.client)).status.sleeping ? 'asleep' : 'awake';
      delete slot.error;
    } catch (err) {
      slot.state = 'failed';
      slot.error = (err as Error).message;
    }
  }

  /** Stops the timers and rejects every waiting request (E_CLOSED). Engines are left as they are. */
  close(): void {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    for (const slot of this.slots.values()) {
      for (const w of slot.waiters.splice(0)) w.reject(new VsnapError('E_CLOSED', 'the SwapController was closed'));
    }
  }

  private slot(name: string): Slot {
    const slot = this.slots.get(name);
    if (!slot) throw new VsnapError('E_UNKNOWN_MODEL', `no engine serves '${name}' (serving: ${[...this.slots.keys()].join(', ')})`, { model: name });
    return slot;
  }

  private lease(slot: Slot): Lease {
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
        for (const notify of this.released.splice(0)) notify();
      },
    };
  }

  private changed(): void {
    this.metrics.awake.set([...this.slots.values()].filter((s) => s.state === 'awake').length);
    this.emit('change', this.states());
  }

  /** Whether `slot` fits next to what is awake, and who is in the way. */
  private blockers(slot: Slot): { fits: boolean; candidates: Slot[] } {
    const usage = this.usage();
    let fits = true;
    for (const d of slot.spec.devices) {
      const held = slot.keptByEngine ? slot.spec.memoryBytes : slot.spec.asleepBytes + this.residentBytes(slot);
      const after = (usage[d] ?? 0) - held + slot.spec.memoryBytes;
      if (after > this.options.budgets[d]!) fits = false;
    }
    const groupMates = slot.spec.group
      ? [...this.slots.values()].filter((s) => s !== slot && s.spec.group === slot.spec.group && s.state !== 'asleep' && s.state !== 'failed')
      : [];
    if (groupMates.length) fits = false;
    const candidates = [...this.slots.values()]
      .filter((s) => s !== slot && s.state === 'awake' && !s.spec.pinned)
      .filter((s) => groupMates.includes(s) || s.spec.devices.some((d) => slot.spec.devices.includes(d)))
      .sort((a, b) => a.lastUsed - b.lastUsed);
    return { fits, candidates };
  }

  /** Runs queued wake-ups one at a time (single flight), oldest request first. */
  private schedule(): void {
    if (this.running || this.closed) return;
    this.running = true;
    void (async () => {
      try {
        for (;;) {
          const next = [...this.slots.values()]
            .filter((s) => s.waiters.length > 0 && s.state !== 'awake')
            .sort((a, b) => a.waiters[0]!.since - b.waiters[0]!.since)[0];
          if (!next) break;
          try {
            await this.bringUp(next);
          } catch (err) {
            const e = toVsnapError(err);
            for (const w of next.waiters.splice(0)) w.reject(e);
            this.metrics.queueDepth.set({ engine: next.spec.name }, 0);
          }
        }
      } finally {
        this.running = false;
      }
    })();
  }

  /** Makes room for `slot` (suspending idle engines) and restores it; grants its waiters. */
  private async bringUp(slot: Slot): Promise<void> {
    for (;;) {
      if (slot.state === 'awake') break;
      const { fits, candidates } = this.blockers(slot);
      if (fits) {
        await this.wake(slot);
        break;
      }
      // The least recently used goes first: an idle awake engine is suspended (keeping its
      // weights in tier 0 if they still leave room), a tier-0 holding is demoted (released).
      const residents = [...this.slots.values()].filter(
        (s) => s !== slot && s.state === 'asleep' && this.residentBytes(s) > 0 && s.spec.devices.some((d) => slot.spec.devices.includes(d)),
      );
      const victim = [...candidates.filter((s) => s.leases === 0), ...residents].sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (victim?.state === 'asleep') {
        this.demote(victim);
        continue;
      }
      if (victim) {
        await this.putToSleep(victim, this.options.captureIfNeeded ?? true, this.mayKeepResident(victim, slot));
        continue;
      }
      if (candidates.length === 0) {
        throw new VsnapError('E_BUSY', `'${slot.spec.name}' cannot fit its GPU budget even with every unpinned engine suspended`, { engine: slot.spec.name });
      }
      if (slot.waiters.length === 0 && !slot.spec.pinned) return; // nobody wants it any more
      // wait for a request to finish (or re-check every half second: waiters may have given up)
      await new Promise<void>((resolve) => {
        const notify = (): void => {
          clearTimeout(timer);
          resolve();
        };
        // on timeout, take the notifier back: they would pile up, two a second, until a release
        const timer = setTimeout(() => {
          this.released = this.released.filter((n) => n !== notify);
          resolve();
        }, 500);
        this.released.push(notify);
      });
    }
    for (const w of slot.waiters.splice(0)) w.resolve(this.lease(slot));
    this.metrics.queueDepth.set({ engine: slot.spec.name }, 0);
  }

  private async wake(slot: Slot): Promise<void> {
    const started = performance.now();
    slot.state = 'waking';
    this.changed();
    this.emit('swapStarted', { engine: slot.spec.name, action: 'restore' });
    try {
      const report = slot.keptByEngine
        ? { phases: { resume: await resumeEngineKeptWeights(slot.spec.client) }, tier: 'gpu' as const, bytes: 0 }
        : await (await Snapshot.open(this.options.store, slot.spec.snapshot)).restoreEngine(slot.spec.client, {
            ...(this.options.cache ? { cache: this.options.cache } : {}),
            ...(this.options.resident ? { resident: this.options.resident } : {}),
          });
      delete slot.keptByEngine;
      slot.state = 'awake';
      slot.lastUsed = Date.now();
      delete slot.error;
      const event: SwapEvent = { engine: slot.spec.name, action: 'restore', seconds: (performance.now() - started) / 1000, phases: report.phases, tier: report.tier };
      this.metrics.swaps.inc({ engine: slot.spec.name, action: 'restore', result: 'ok' });
      this.metrics.swapSeconds.observe({ engine: slot.spec.name, action: 'restore', tier: report.tier }, event.seconds);
      this.metrics.bytesMoved.inc({ engine: slot.spec.name }, report.bytes);
      this.changed();
      this.emit('swap', event);
    } catch (err) {
      const e = toVsnapError(err);
      slot.state = e.details.recovered === true || e.code === 'E_SNAPSHOT_NOT_FOUND' ? 'asleep' : 'failed';
      slot.error = e.message;
      this.metrics.swaps.inc({ engine: slot.spec.name, action: 'restore', result: 'error' });
      this.changed();
      this.emit('swapFailed', { engine: slot.spec.name, action: 'restore', error: e });
      throw e;
    }
  }

  private async putToSleep(slot: Slot, captureIfNeeded: boolean, keepResident = false): Promise<SwapEvent> {
    const started = performance.now();
    slot.state = 'suspending';
    this.changed();
    this.emit('swapStarted', { engine: slot.spec.name, action: 'suspend' });
    try {
      const resident = keepResident ? this.options.resident : undefined;
      const result = await Snapshot.suspendEngine(this.options.store, slot.spec.snapshot, slot.spec.client, {
        captureIfNeeded,
        ...(this.options.cache ? { capture: { cache: this.options.cache } } : {}),
        ...(resident ? { resident } : {}),
      });
      slot.state = 'asleep';
      const event: SwapEvent = { engine: slot.spec.name, action: 'suspend', seconds: (performance.now() - started) / 1000, captured: result.captured };
      this.metrics.swaps.inc({ engine: slot.spec.name, action: 'suspend', result: 'ok' });
      this.metrics.swapSeconds.observe({ engine: slot.spec.name, action: 'suspend', tier: resident ? 'gpu' : 'store' }, event.seconds);
      this.changed();
      this.emit('swap', event);
      return event;
    } catch (err) {
      const e = toVsnapError(err);
      slot.state = 'awake'; // refused or failed: its weights stay where they are
      slot.error = e.message;
      this.metrics.swaps.inc({ engine: slot.spec.name, action: 'suspend', result: 'error' });
      this.changed();
      this.emit('swapFailed', { engine: slot.spec.name, action: 'suspend', error: e });
      throw e;
    }
  }

  /** Releases the weights tier 0 holds for a suspended engine (its snapshot brings them back). */
  private demote(slot: Slot): void {
    this.options.resident!.release(slot.spec.client.baseUrl);
    this.changed();
  }

  /** Suspends least recently used unpinned engines until every device is within budget. */
  private async fitToBudget(): Promise<void> {
    for (;;) {
      const usage = this.usage();
      const over = Object.entries(usage).find(([d, used]) => used > this.options.budgets[Number(d)]!);
      if (!over) return;
      const device = Number(over[0]);
      const resident = [...this.slots.values()].find((s) => s.state === 'asleep' && this.residentBytes(s) > 0 && s.spec.devices.includes(device));
      if (resident) {
        this.demote(resident);
        continue;
      }
      const victim = [...this.slots.values()]
        .filter((s) => s.state === 'awake' && !s.spec.pinned && s.spec.devices.includes(device))
        .sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!victim) {
        throw new VsnapError('E_BUSY', `device ${device} is over its budget with only pinned engines awake: raise the budget or unpin one`, { device });
      }
      await this.putToSleep(victim, this.options.captureIfNeeded ?? true, false);
    }
  }

  /** Idle TTLs and the default model, checked every second. */
  private tick(): void {
    if (this.running || this.closed) return;
    const now = Date.now();
    const expired = [...this.slots.values()].find(
      (s) => s.state === 'awake' && !s.spec.pinned && s.leases === 0 && s.spec.idleTtlMs !== undefined && now - s.lastUsed > s.spec.idleTtlMs && s.spec.name !== this.options.defaultModel,
    );
    if (expired) {
      this.runExclusive(() => this.putToSleep(expired, this.options.captureIfNeeded ?? true, this.mayKeepResident(expired)));
      return;
    }
    const name = this.options.defaultModel;
    if (name === undefined) return;
    // idle: no unpinned engine awake or waking, and nobody waiting
    const idle = [...this.slots.values()].every((s) => (s.spec.pinned || (s.state !== 'awake' && s.state !== 'waking')) && s.waiters.length === 0);
    const slot = this.slots.get(name)!;
    if (idle && slot.state === 'asleep') this.runExclusive(() => this.bringUp(slot));
  }

  /** Runs one background step of tick() (its failure is already reported as an event). */
  private runExclusive(step: () => Promise<unknown>): void {
    this.running = true;
    void step()
      .catch(() => undefined)
      .finally(() => {
        this.running = false;
        this.schedule();
      });
  }
}
