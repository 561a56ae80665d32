import { toVsnapError, VsnapError } from '../errors.js';
import { restoreEngine, type EngineRestoreReport, type SnapshotRef } from '../flows/index.js';
import { restoreEngineWith } from '../flows/restore.js';
import { restoreFailure } from '../flows/restore-failure.js';
import { RETRY_MS, type SwapContext } from './context.js';
import { flowHooks, KEPT_BY_ENGINE, restoreOptions } from './flow-options.js';
import { checkRestorable, damageReason, SNAPSHOT_FAULTS } from './readiness.js';
import { capturing, cool, damaged, engineState, keptByEngine, processesBack, recovered, snapshotWeights, wakeFailed, waking, woke, type Slot } from './state.js';
import type { SwapEvent } from './types.js';

/*
 * The executor's restore side: the check that an engine can be brought back before anyone is
 * suspended for it, and its wake (restoreEngine, or the engine's own tier 0), with what a failure
 * leaves: its state read back, its snapshot marked when it was the snapshot's fault, its waiters
 * told in a short message (the operator's detail goes to `swapFailed`).
 */

/**
 * Whether `slot` may be brought up: it answers, and its snapshot (or a tier, or the engine itself)
 * can bring its weights back. False when it cannot be checked now (its waiters were told), or is
 * awake already; a damaged snapshot is marked (and, without recovery, refused by the planner).
 * @internal
 */
export async function checkFor(ctx: SwapContext, slot: Slot): Promise<boolean> {
  const name = slot.spec.name;
  if (slot.state.kind === 'failed' && (await ctx.readState(slot)) === 'failed') {
    // Nothing is suspended for an engine that does not answer.
    ctx.rejectWaiters(slot, new VsnapError('E_ENGINE_UNREACHABLE', `the engine of '${name}' does not answer; retry later`, { engine: name }));
    return false;
  }
  if (slot.state.kind === 'awake') return false;
  if (keptByEngine(slot.state)) return true; // the engine kept its weights: it resumes without a snapshot
  const { config } = ctx;
  try {
    const found = await checkRestorable({ store: config.store, name: slot.spec.snapshot, engineKey: slot.spec.client.baseUrl, ram: config.ram, resident: config.gpu, known: slot.snapshot.damage });
    if (found.damage) ctx.markDamaged(slot, found.damage, found.detail);
    else damaged(slot, undefined);
    if (config.overlap && slot.spec.weightsBytes === undefined && !found.damage) snapshotWeights(slot, await largestRank(ctx, slot));
    return true;
  } catch (err) {
    const e = toVsnapError(err); // the store failed (not the snapshot): tell the waiters, try again later
    ctx.events.emit('swapFailed', { engine: name, action: 'restore', error: e });
    ctx.rejectWaiters(slot, new VsnapError(e.code, `'${name}' could not be checked for a restore (${e.code}); retry later`, { engine: name }, { cause: e }));
    return false;
  }
}

/** The largest rank of its current snapshot, in bytes (undefined when it cannot be read: no overlap then). */
async function largestRank(ctx: SwapContext, slot: Slot): Promise<number | undefined> {
  const manifest = await ctx.config.store.current(slot.spec.snapshot).catch(() => undefined);
  if (!manifest) return undefined;
  return Math.max(0, ...manifest.data.ranks.map((r) => r.regions.reduce((n, x) => n + x.size, 0)));
}

/** In an overlapped swap: the engine suspended for this one, its sleep, and what this one holds until then. @internal */
export interface Room {
  readonly victim: string;
  readonly slept: Promise<void>;
  readonly holding: number;
  /** Told once this engine's copy is over (landed, not needed, or failed): the victim sleeps only then. */
  readonly afterCopy: (() => Promise<void>) | undefined;
}

/** Wakes it; `onto`: a deep-suspended engine's process is restored onto that GPU first. @internal */
export async function wake(ctx: SwapContext, slot: Slot, onto?: readonly number[], room?: Room): Promise<void> {
  const { metrics, events } = ctx;
  const name = slot.spec.name;
  const started = performance.now();
  const kept = keptByEngine(slot.state);
  waking(slot, room?.holding);
  ctx.changed();
  events.emit('swapStarted', { engine: name, action: 'restore' });
  let snapshotId: string | undefined;
  try {
    let report;
    try {
      report = kept ? await resumeKept(ctx, slot) : await restore(ctx, slot, (id) => (snapshotId = id), onto, room);
    } finally {
      void room?.afterCopy?.(); // a restore that ended before its copy (or failed) lets the victim sleep before this wake reads back why
    }
    woke(slot, onto); // it runs there now
    const path = 'path' in report ? report.path : undefined;
    if (path === undefined || path === 'restored') recovered(slot, undefined);
    // a snapshot the store lacked was pulled from its registry by this restore: no longer missing
    if (slot.spec.from && slot.snapshot.damage?.snapshotId === undefined && path === 'restored') damaged(slot, undefined);
    const recovery = 'recovery' in report ? report.recovery : undefined;
    const event: SwapEvent = {
      engine: name,
      action: 'restore',
      seconds: (performance.now() - started) / 1000,
      phases: report.phases,
      tier: report.tier,
      ...(recovery ? { recovered: recovery.reason } : {}),
      ...('multipath' in report && report.multipath ? { bytesViaNeighbour: report.multipath.bytesNeighbour } : {}),
    };
    if (recovery) recoveredBy(ctx, slot, report as EngineRestoreReport, event.seconds);
    metrics.swaps.inc({ engine: name, action: 'restore', result: 'ok' });
    metrics.swapSeconds.observe({ engine: name, action: 'restore', tier: report.tier }, event.seconds);
    metrics.bytesMoved.inc({ engine: name }, report.bytes);
    if (report.tier === 'neighbour') ctx.neighbour?.hit(name);
    ctx.changed();
    events.emit('swap', event);
  } catch (err) {
    const e = toVsnapError(err);
    metrics.swaps.inc({ engine: name, action: 'restore', result: 'error' });
    // In an overlapped swap whose suspend failed, the restore was called off: no fault of this engine.
    const roomError = room ? await room.slept.then(() => undefined, (x: unknown) => toVsnapError(x)) : undefined;
    if (!roomError) cool(slot, Date.now() + RETRY_MS);
    // The processes were restored (and moved, with onto) before a later step failed: the engine
    // is no longer deep, it holds its context (asleepBytes) where it runs now.
    const failure = restoreFailure(e); // undefined: it failed before the engine was touched
    if (slot.spec.deepSuspend && failure) processesBack(slot, onto);
    // A failed recovery still says the snapshot was bad (its snapshotError).
    const fault = SNAPSHOT_FAULTS.has(e.code) ? e.code : failure?.snapshotError;
    if (fault !== undefined && SNAPSHOT_FAULTS.has(fault)) ctx.markDamaged(slot, { snapshotId, reason: damageReason(fault, snapshotId) }, e.message);
    if (failure?.recovery) metrics.recoveries.inc({ engine: name, reason: failure.recovery, result: 'error' });
    // What the engine really is now. Awake after a failed restore means its weights are not
    // the verified ones (it could not be put back to sleep): never lease it.
    const now = await ctx.readState(slot);
    wakeFailed(slot, e.message, now === 'awake' || failure?.engineAsleep === false);
    ctx.changed();
    events.emit('swapFailed', { engine: name, action: 'restore', error: e });
    // Clients get a short answer; the operator's detail (paths, mismatches) is the event's error.
    const damage = slot.snapshot.damage;
    const message = damage
      ? `'${name}' cannot be restored: ${damage.reason}. Re-capture its snapshot, or repair it and verify it.`
      : roomError
        ? `'${name}' could not be given room: suspending '${room!.victim}' failed (${roomError.code}). Retry later.`
        : `the restore of '${name}' failed (${e.code}); the engine is ${engineState(slot.state)}. Retry later.`;
    ctx.rejectWaiters(slot, new VsnapError(damage ? 'E_NOT_RESTORABLE' : (roomError?.code ?? e.code), message, { engine: name }, { cause: e }));
  }
}

/** restoreEngine from its snapshot (or, with recovery, from a reference to it when it cannot be opened). */
async function restore(ctx: SwapContext, slot: Slot, opened: (id: string) => void, onto: readonly number[] | undefined, room: Room | undefined) {
  const { config } = ctx;
  // Opened by restoreEngine under the store's lock, so no gc (`vsnap rm`) falls between its manifest
  // read and its copy. With recovery, one it cannot open is pulled (from a registry source) or recovered past.
  const source: SnapshotRef = { store: config.store, name: slot.spec.snapshot, ...(config.recovery.reload && slot.spec.from ? { from: slot.spec.from } : {}) };
  const neighbour = ctx.neighbour?.tier;
  const onWarning = (message: string): void => void ctx.events.emit('warning', { engine: slot.spec.name, message });
  const gate = room ? { beforeKvWake: () => room.slept, ...(room.afterCopy ? { afterCopy: room.afterCopy } : {}) } : {};
  const hooks = flowHooks(config, { ...gate, opened: (snapshot) => opened(snapshot.id) });
  return restoreEngineWith(source, slot.spec.client, restoreOptions(config, slot, { neighbour, onto, onWarning }), hooks);
}

/** The engine's own tier 0: wake its KV cache (no snapshot, nothing moved). */
async function resumeKept(ctx: SwapContext, slot: Slot) {
  const report = await restoreEngine({ store: ctx.config.store, name: slot.spec.snapshot }, slot.spec.client, KEPT_BY_ENGINE);
  return { phases: report.phases, tier: report.tier, bytes: 0 };
}

/** Counts and reports a recovery; follows its background capture, if any. */
function recoveredBy(ctx: SwapContext, slot: Slot, report: EngineRestoreReport, seconds: number): void {
  const { metrics, events } = ctx;
  const r = report.recovery!;
  const name = slot.spec.name;
  metrics.recoveries.inc({ engine: name, reason: r.reason, result: 'ok' });
  metrics.recoverySeconds.observe({ engine: name, reason: r.reason }, seconds);
  const mine = { reason: r.reason, code: r.code, at: Date.now(), snapshot: r.materialize === 'off' ? 'off' : r.snapshot ? 'captured' : 'capturing' } as const;
  recovered(slot, mine);
  if (r.snapshot) damaged(slot, undefined); // a new capture replaced the bad one
  events.emit('recovered', { engine: name, reason: r.reason, code: r.code, message: r.message, seconds, expectedResponse: r.expectedResponse });
  if (!r.materialized) return;
  const pending: Promise<void> = r.materialized.then((outcome) => {
    if (slot.recovery.capture === pending) capturing(slot, undefined);
    if (slot.recovery.last === mine) recovered(slot, { ...mine, snapshot: outcome.ok ? 'captured' : 'failed' });
    if (outcome.ok) {
      if (slot.snapshot.damage?.snapshotId !== outcome.snapshot.id) damaged(slot, undefined);
      events.emit('materialized', { engine: name, snapshotId: outcome.snapshot.id });
    } else {
      events.emit('materializeFailed', { engine: name, error: outcome.error });
    }
    ctx.changed();
  });
  capturing(slot, pending);
}
