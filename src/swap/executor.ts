import { abortError, toVsnapError, VsnapError } from '../errors.js';
import { swapAtOnce } from '../flows/hooks.js';
import type { VerifyReport } from '../store/region-store.js';
import type { SwapContext } from './context.js';
import { mayKeepResident, plan, type Action } from './planner.js';
import { suspend, keepInEngine, demote } from './sleep.js';
import { damaged, dequeue, engineState, enqueue, roomMade, takeWaiters, touched, used, type Slot, type Waiter } from './state.js';
import type { Lease, SwapEvent } from './types.js';
import { checkFor, wake } from './wake.js';

const closedError = (): VsnapError => new VsnapError('E_CLOSED', 'the SwapController was closed');

/**
 * The one place where the controller's state changes under concurrency: every mutation (the
 * planner's steps, manual suspends, resyncs) runs through `serial`, one at a time, so no two steps
 * ever overlap (a compound `swap` step runs its suspend and its restore at once, as one step) and a
 * decision is never made on a state another step is changing. After any failed step the engine's
 * real state is read back instead of assumed. Once closed it starts nothing: jobs still queued are
 * refused (E_CLOSED), the one in flight finishes.
 * @internal
 */
export class SwapExecutor {
  private queue: Promise<unknown> = Promise.resolve();
  private pumpQueued = false;
  private isClosed = false;
  private closing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** Engines whose snapshot was checked restorable for the bring-up now in progress. */
  private readonly checked = new Set<Slot>();

  constructor(private readonly ctx: SwapContext) {}

  get closed(): boolean {
    return this.isClosed;
  }

  /** Runs `job` after every job queued before it (and before any queued after); refused once closed. */
  serial<T>(job: () => Promise<T>): Promise<T> {
    const run = this.queue.then(() => (this.closed ? Promise.reject(closedError()) : job()));
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Reads every engine's state, settles within the budgets, and starts the idle timer. */
  async start(): Promise<void> {
    const { ctx } = this;
    await this.serial(() => Promise.all([...ctx.slots.values()].filter((slot) => !slot.booting).map((slot) => ctx.readState(slot))));
    await this.settle();
    ctx.changed();
    this.timer = setInterval(() => this.pump(), 1000);
    this.timer.unref();
  }

  /** Queues one planning step (at most one is queued at a time; each step queues the next). */
  pump(): void {
    if (this.pumpQueued || this.closed) return;
    this.pumpQueued = true;
    this.serial(async () => {
      this.pumpQueued = false;
      if (await this.step()) this.pump();
    }).catch((err: unknown) => {
      if (!(err instanceof VsnapError && err.code === 'E_CLOSED')) throw err; // refused after close; steps report their own failures
    });
  }

  /** Takes steps until nothing is left to do now; throws E_BUSY when a device stays over budget. */
  async settle(): Promise<void> {
    for (;;) {
      const action = await this.serial(async () => {
        const next = plan(this.ctx.planInput());
        if (next.kind === 'overBudget') return next;
        return (await this.step()) ? undefined : next;
      });
      if (action?.kind === 'overBudget') throw new VsnapError('E_BUSY', action.message, { device: action.device });
      if (action) return;
    }
  }

  /** Plans and takes one step; false when there is nothing to do now. */
  private async step(): Promise<boolean> {
    const action = plan(this.ctx.planInput());
    // A refusal for a known-damaged snapshot is checked again too: a new capture clears it.
    const recheck = action.kind === 'reject' && action.code === 'E_NOT_RESTORABLE';
    const target = action.kind === 'swap' ? action.wake : action.kind === 'wake' || recheck ? action.engine : action.kind === 'suspend' || action.kind === 'demote' ? action.for : undefined;
    if (target !== undefined) {
      // Before anyone is suspended for it (or it is woken), make sure its snapshot can bring it back.
      const slot = this.slot(target);
      if (!this.checked.has(slot)) {
        if (await checkFor(this.ctx, slot)) this.checked.add(slot);
        return true; // plan again: the state may have changed meanwhile
      }
    }
    return this.take(action);
  }

  private slot(name: string): Slot {
    return this.ctx.slots.get(name)!;
  }

  private async take(action: Action): Promise<boolean> {
    const { ctx } = this;
    const capture = ctx.config.captureIfNeeded;
    switch (action.kind) {
      case 'grant': {
        const slot = this.slot(action.engine);
        this.checked.delete(slot);
        for (const w of takeWaiters(slot)) w.resolve(this.lease(slot));
        ctx.metrics.queueDepth.set({ engine: slot.spec.name }, 0);
        return true;
      }
      case 'wake':
        this.checked.delete(this.slot(action.engine));
        await wake(ctx, this.slot(action.engine), action.onto);
        return true;
      case 'suspend':
        try {
          await suspend(ctx, this.slot(action.engine), capture, action.keepResident, action.for);
        } catch (err) {
          // No room was made: the requests it was for learn why now rather than at their timeout.
          const target = action.for === undefined ? undefined : this.slot(action.for);
          const e = toVsnapError(err);
          if (target) ctx.rejectWaiters(target, new VsnapError(e.code, `'${target.spec.name}' could not be given room: suspending '${action.engine}' failed (${e.code}). Retry later.`, { engine: target.spec.name }, { cause: e }));
        }
        return true;
      case 'demote':
        await demote(ctx, this.slot(action.engine));
        return true;
      case 'swap': {
        // swapEngines' `weights`, as two steps run at once: the restore's KV cache wakes once the
        // suspend is done; a failed suspend fails the restore (back to sleep, its waiters told).
        const b = this.slot(action.wake);
        this.checked.delete(b);
        // Until the other engine sleeps, b is accounted with its weights only (what the planner checked).
        const weights = b.spec.weightsBytes ?? b.snapshot.weightsBytes ?? 0;
        const holding = Math.max(b.spec.asleepBytes + ctx.residentBytes(b), b.spec.asleepBytes + weights);
        // The one swap primitive (flows/hooks.ts): the suspended engine sleeps once b's copy is over.
        await swapAtOnce(
          (hooks) => suspend(ctx, this.slot(action.suspend), capture, action.keepResident, action.wake, hooks.beforeSleep),
          (hooks, suspending) => {
            const slept = suspending.then(() => roomMade(b));
            slept.catch(() => undefined);
            return wake(ctx, b, undefined, { victim: action.suspend, slept, holding, afterCopy: hooks.afterCopy });
          },
        );
        ctx.changed();
        return true;
      }
      case 'evictParked':
        ctx.neighbour?.evict(action.id, action.for === undefined ? 'budget' : 'room', action.for);
        ctx.changed();
        return true;
      case 'reject': {
        const slot = this.slot(action.engine);
        this.checked.delete(slot);
        const err = new VsnapError(action.code, action.code === 'E_NOT_RESTORABLE' ? `${action.message}. Re-capture its snapshot, or repair it and verify it.` : action.message, { engine: action.engine });
        ctx.rejectWaiters(slot, err);
        return true;
      }
      case 'idle':
        this.checked.clear();
        return false;
      default:
        return false; // wait (a release or a new request pumps again), overBudget
    }
  }

  /** A lease on an awake engine: it is not suspended until every lease is released. */
  lease(slot: Slot): Lease {
    used(slot, 1);
    let released = false;
    return {
      engine: slot.spec.name,
      client: slot.spec.client,
      release: () => {
        if (released) return;
        released = true;
        used(slot, -1);
        this.pump();
      },
    };
  }

  /** A lease once the engine is awake (SwapController.acquire). */
  acquire(slot: Slot, options: { signal?: AbortSignal | undefined; timeoutMs?: number | undefined }): Promise<Lease> {
    const { metrics, config } = this.ctx;
    const model = slot.spec.name;
    if (this.closed) return Promise.reject(closedError());
    if (slot.state.kind === 'awake' && slot.waiters.length === 0) {
      metrics.requests.inc({ engine: model, result: 'hit' });
      return Promise.resolve(this.lease(slot));
    }
    const limit = config.queue.limit;
    if (slot.waiters.length >= limit) {
      metrics.requests.inc({ engine: model, result: 'busy' });
      return Promise.reject(new VsnapError('E_BUSY', `${limit} requests already wait for '${model}' to wake; retry later`, { engine: model, queueLimit: limit }));
    }
    if (options.signal?.aborted) return Promise.reject(abortError(options.signal, `waiting for '${model}'`));
    return new Promise<Lease>((resolve, reject) => {
      const timeoutMs = options.timeoutMs ?? config.queue.timeoutMs;
      const done = (): void => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        dequeue(slot, waiter);
        metrics.queueDepth.set({ engine: model }, slot.waiters.length);
      };
      const timer = setTimeout(() => {
        done();
        metrics.requests.inc({ engine: model, result: 'timeout' });
        reject(new VsnapError('E_TIMEOUT', `'${model}' did not wake within ${timeoutMs} ms`, { engine: model, timeoutMs }));
        this.pump(); // what it waited for may no longer be needed
      }, timeoutMs);
      const onAbort = (): void => {
        done();
        reject(abortError(options.signal, `waiting for '${model}'`));
        this.pump();
      };
      const waiter: Waiter = {
        since: Date.now(),
        resolve: (lease) => {
          done();
          metrics.requests.inc({ engine: model, result: 'woken' });
          resolve(lease);
        },
        reject: (err) => {
          done();
          reject(err);
        },
      };
      options.signal?.addEventListener('abort', onAbort, { once: true });
      enqueue(slot, waiter);
      metrics.queueDepth.set({ engine: model }, slot.waiters.length);
      this.pump();
    });
  }

  /** SwapController.suspend: now, if no request uses it (after the step in progress). */
  async suspendNow(slot: Slot, options: { captureIfNeeded?: boolean | undefined; keepWeightsInEngine?: boolean | undefined }): Promise<SwapEvent | undefined> {
    const { ctx } = this;
    try {
      return await this.serial(async () => {
        if (slot.state.kind === 'failed') await ctx.readState(slot);
        const state = engineState(slot.state);
        if (state === 'asleep') return undefined;
        if (state !== 'awake' || slot.leases > 0 || slot.waiters.length > 0) {
          const what = slot.leases > 0 ? `serving ${slot.leases} request(s)` : slot.waiters.length > 0 ? `wanted by ${slot.waiters.length} request(s)` : state;
          throw new VsnapError('E_BUSY', `'${slot.spec.name}' is ${what}; retry when it is idle`, { engine: slot.spec.name });
        }
        if (options.keepWeightsInEngine) return keepInEngine(ctx, slot);
        const input = ctx.planInput();
        return suspend(ctx, slot, options.captureIfNeeded ?? false, mayKeepResident(input, input.engines.find((e) => e.name === slot.spec.name)!));
      });
    } finally {
      this.pump();
    }
  }

  /** SwapController.resync: re-reads its state, then settles. */
  async resync(slot: Slot): Promise<void> {
    const { ctx } = this;
    await this.serial(async () => {
      await ctx.readState(slot);
      if (slot.state.kind !== 'failed') touched(slot);
      ctx.changed();
    });
    try {
      await this.settle();
    } finally {
      this.pump();
    }
  }

  /** SwapController.verifySnapshot: a snapshot that passed is no longer marked damaged; one that failed is. */
  async verified(slot: Slot, snapshotId: string, report: VerifyReport): Promise<void> {
    await this.serial(async () => {
      damaged(slot, report.ok ? undefined : { snapshotId, reason: `its snapshot (capture ${snapshotId}) failed verification: ${report.problems.length} problem(s)` });
      this.ctx.changed();
    });
    this.pump();
  }

  /**
   * Stops: no step starts from now (queued jobs are refused with E_CLOSED, waiting requests too),
   * the step in flight and the background captures after recoveries finish, then the neighbour
   * tier the controller made is freed. Idempotent.
   */
  close(): Promise<void> {
    if (!this.closing) {
      this.isClosed = true;
      this.closing = this.drain();
    }
    return this.closing;
  }

  private async drain(): Promise<void> {
    const { ctx } = this;
    if (this.timer) clearInterval(this.timer);
    for (const slot of ctx.slots.values()) ctx.rejectWaiters(slot, closedError());
    await this.queue;
    await Promise.all([...ctx.slots.values()].map((s) => s.recovery.capture));
    ctx.neighbour?.close();
  }
}
