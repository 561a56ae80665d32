import { checkGpuHold } from '../cache/gpu-tier.js';
import { toVsnapError, VsnapError } from '../errors.js';
import { suspendEngine, type EngineSuspendResult } from '../flows/index.js';
import { suspendEngineWith } from '../flows/suspend.js';
import type { TierName } from '../tiers/tier.js';
import { RETRY_MS, type SwapContext } from './context.js';
import { flowHooks, KEPT_BY_ENGINE, suspendOptions } from './flow-options.js';
import { damaged, demoted, keptAsleep, lockHold, suspended, suspendFailed, suspending, type Asleep, type Slot } from './state.js';
import type { SwapEvent } from './types.js';

/*
 * The executor's suspend side: a suspend (into the snapshot, tier 0 or the neighbour tier, or
 * deep), the engine's own tier 0, and tier 0's demotion after the dirty check. A failure reads the
 * engine's state back instead of assuming it.
 */

/** The tier a suspend left the weights in: the one that kept them, else the RAM tier where it holds the snapshot, else the store. */
function tierAfter(ctx: SwapContext, result: EngineSuspendResult): TierName {
  return result.tier ?? (ctx.config.ram?.has(result.snapshot.id) ? 'ram' : 'store');
}

/** Where a suspend left the weights. */
function asleepAfter(slot: Slot, tier: TierName): Asleep {
  if (slot.spec.deepSuspend) return { kind: 'deep' };
  return { kind: 'asleep', tier };
}

/** Suspends an engine (`beforeSleep`: awaited right before its sleep); on failure, reads back what it really is and rethrows. @internal */
export async function suspend(ctx: SwapContext, slot: Slot, captureIfNeeded: boolean, keepResident: boolean, forEngine?: string, beforeSleep?: () => Promise<void>): Promise<SwapEvent> {
  const { config, metrics, events, neighbour } = ctx;
  const name = slot.spec.name;
  // A capture after a recovery still running: let it finish, so the suspend finds its snapshot.
  if (slot.recovery.capture) await slot.recovery.capture;
  const started = performance.now();
  suspending(slot);
  ctx.changed();
  events.emit('swapStarted', { engine: name, action: 'suspend' });
  try {
    const gpu = keepResident && !slot.spec.deepSuspend ? config.gpu : undefined;
    // Not parked when tier 0 keeps the weights on their own GPU; else the planner decides.
    const park = !gpu && neighbour?.parkable(slot.devices) ? neighbour.parkOptions(name, () => ctx.planInput(), forEngine) : undefined;
    const onWarning = (message: string): void => void events.emit('warning', { engine: name, message });
    const options = suspendOptions(config, slot, { captureIfNeeded, gpu, neighbour: park, onWarning });
    const result = (await suspendEngineWith(config.store, slot.spec.snapshot, slot.spec.client, options, flowHooks(config, beforeSleep ? { beforeSleep } : {}))) as EngineSuspendResult;
    neighbour?.parked(name, result.parked, result.snapshot.id);
    const tier = tierAfter(ctx, result);
    suspended(slot, asleepAfter(slot, tier));
    if (result.captured) damaged(slot, undefined); // a new capture: whatever was wrong with the old one is gone
    const event: SwapEvent = { engine: name, action: 'suspend', seconds: (performance.now() - started) / 1000, phases: result.phases, captured: result.captured };
    metrics.swaps.inc({ engine: name, action: 'suspend', result: 'ok' });
    metrics.swapSeconds.observe({ engine: name, action: 'suspend', tier }, event.seconds);
    ctx.changed();
    events.emit('swap', event);
    return event;
  } catch (err) {
    const e = toVsnapError(err);
    await ctx.readState(slot); // refused, failed half way, or the answer was lost: ask the engine
    // a failed deep step rolls back to a level-2 sleep: the engine holds its context again
    suspendFailed(slot, e.message, slot.spec.deepSuspend === true, Date.now() + RETRY_MS);
    metrics.swaps.inc({ engine: name, action: 'suspend', result: 'error' });
    ctx.changed();
    events.emit('swapFailed', { engine: name, action: 'suspend', error: e });
    throw e;
  }
}

/**
 * The engine's own tier 0 (vLLM's release_kv_cache_memory): the engine pauses and frees only its
 * KV cache, weights kept. It still counts as awake in the budget and is never demoted.
 * @internal
 */
export async function keepInEngine(ctx: SwapContext, slot: Slot): Promise<SwapEvent> {
  const { config, metrics, events } = ctx;
  const name = slot.spec.name;
  suspending(slot);
  ctx.changed();
  events.emit('swapStarted', { engine: name, action: 'suspend' });
  try {
    const r = await suspendEngine(config.store, slot.spec.snapshot, slot.spec.client, KEPT_BY_ENGINE);
    keptAsleep(slot);
    const event: SwapEvent = { engine: name, action: 'suspend', seconds: r.seconds, captured: false };
    metrics.swaps.inc({ engine: name, action: 'suspend', result: 'ok' });
    metrics.swapSeconds.observe({ engine: name, action: 'suspend', tier: 'engine' }, event.seconds);
    ctx.changed();
    events.emit('swap', event);
    return event;
  } catch (err) {
    const e = toVsnapError(err);
    await ctx.readState(slot);
    suspendFailed(slot, e.message, false);
    metrics.swaps.inc({ engine: name, action: 'suspend', result: 'error' });
    ctx.changed();
    events.emit('swapFailed', { engine: name, action: 'suspend', error: e });
    throw e;
  }
}

/**
 * Releases the weights tier 0 holds for a suspended engine, after the dirty check: the held
 * memory must still equal the snapshot that brings the engine back (a weight update racing the
 * suspend would otherwise be lost). Weights that differ, or cannot be checked, are kept: the
 * engine is marked so the planner never demotes it, and `swapFailed` says why.
 * @internal
 */
export async function demote(ctx: SwapContext, slot: Slot): Promise<void> {
  const { config, events } = ctx;
  const resident = config.gpu!;
  const entry = resident.peek(slot.spec.client.baseUrl);
  if (entry) {
    let problem: string | undefined;
    let cause: unknown;
    try {
      const manifest = await config.store.get(slot.spec.snapshot, entry.snapshotId); // the manifest only: no hold on gc
      const report = await checkGpuHold(manifest, entry);
      if (!report.checked) problem = `snapshot ${entry.snapshotId} has no GPU digests to check them against`;
      else if (report.changed.length) problem = `they differ from snapshot ${entry.snapshotId} in ${report.changed.length} region(s): ${report.changed.slice(0, 5).join(', ')}`;
    } catch (err) {
      cause = err;
      problem = `they could not be checked against snapshot ${entry.snapshotId} (${toVsnapError(err).code})`;
    }
    if (problem !== undefined) {
      lockHold(slot, problem);
      const e = new VsnapError('E_STALE', `the weights tier 0 holds for '${slot.spec.name}' were not released: ${problem}. Wake it (they come back as they are), then capture it again.`, { engine: slot.spec.name }, cause === undefined ? {} : { cause });
      events.emit('swapFailed', { engine: slot.spec.name, action: 'demote', error: e });
      ctx.changed();
      return;
    }
  }
  resident.release(slot.spec.client.baseUrl);
  demoted(slot, entry && config.ram?.has(entry.snapshotId) ? 'ram' : 'store');
  ctx.changed();
}
