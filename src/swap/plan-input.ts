import type { SwapConfig } from './options.js';
import type { PlanEngine, PlanInput, PlanNeighbour } from './planner.js';
import { engineState, holdLocked, keptByEngine, nextSleep, type Slot } from './state.js';

/*
 * The planner's input, from the slots: the one place where the controller's state is read for a
 * decision (the planner itself imports nothing, so it sees only what this gives it).
 */

/** Tier-0 bytes kept for a suspended engine, per device. @internal */
export function residentBytes(config: SwapConfig, slot: Slot): number {
  const e = config.gpu?.peek(slot.spec.client.baseUrl);
  return e ? (slot.spec.weightsBytes ?? e.bytes / slot.devices.length) : 0;
}

/** One engine as the planner sees it. */
function planEngine(config: SwapConfig, s: Slot): PlanEngine {
  const { spec, state } = s;
  // A deep engine (asleep deep, or to be: its next suspend goes deep) holds nothing while it sleeps, and may move.
  const deep = spec.deepSuspend === true && nextSleep(s).kind === 'deep';
  return {
    name: spec.name,
    state: engineState(state),
    leases: s.leases,
    waitingSince: s.waiters[0]?.since,
    lastUsed: s.lastUsed,
    pinned: spec.pinned ?? false,
    devices: s.devices,
    memoryBytes: state.kind === 'waking' && state.holding !== undefined ? state.holding : spec.memoryBytes,
    asleepBytes: deep ? 0 : spec.asleepBytes,
    residentBytes: residentBytes(config, s),
    weightsBytes: spec.deepSuspend ? undefined : spec.weightsBytes, // tier 0 never holds a deep engine's weights
    group: spec.group,
    idleTtlMs: spec.idleTtlMs,
    unrestorable: config.recovery.reload ? undefined : s.snapshot.damage?.reason, // with recovery, a bad snapshot is reloaded past
    retryAt: s.retryAt,
    keptByEngine: keptByEngine(state),
    holdLocked: holdLocked(state),
    movableTo: deep ? spec.movableTo : undefined,
    swapWeightsBytes: spec.deepSuspend ? undefined : (spec.weightsBytes ?? s.snapshot.weightsBytes),
  };
}

/** Everything the planner decides on. @internal */
export function planInput(config: SwapConfig, slots: Iterable<Slot>, neighbour: PlanNeighbour | undefined): PlanInput {
  return {
    engines: [...slots].map((s) => planEngine(config, s)),
    budgets: config.budgets,
    defaultModel: config.defaultModel,
    tier0: config.gpu !== undefined,
    now: Date.now(),
    overlap: config.overlap,
    ...(neighbour ? { neighbour } : {}),
  };
}
