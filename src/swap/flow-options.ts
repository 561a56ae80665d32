import type { NeighbourParkOptions, NeighbourTier } from '../cache/neighbour-tier.js';
import type { GpuTier } from '../cache/gpu-tier.js';
import type { EngineRestoreOptions, EngineSuspendOptions } from '../flows/index.js';
import type { FlowHooks } from '../flows/hooks.js';
import type { SwapConfig } from './options.js';
import type { Slot } from './state.js';

/*
 * The controller's options as the engine flows take them: the one translation from
 * SwapControllerOptions (and a slot) to restoreEngine's and suspendEngine's options.
 */

/** Whether a restore of this engine goes over two PCIe links (tiers.multipath): one GPU, not the neighbour. */
function twoLinks(config: SwapConfig, slot: Slot): boolean {
  const m = config.multipath;
  return m !== undefined && slot.devices.length === 1 && slot.devices[0] !== m.neighbour;
}

/**
 * restoreEngine's options for a wake: `neighbour` (an open tier), `onto` (a move).
 * @internal
 */
export function restoreOptions(
  config: SwapConfig,
  slot: Slot,
  step: {
    neighbour?: NeighbourTier | undefined;
    onto?: readonly number[] | undefined;
    onWarning: (message: string) => void;
  },
): EngineRestoreOptions {
  const tiers = {
    ...(config.ram ? { ram: config.ram } : {}),
    ...(config.gpu ? { gpu: config.gpu } : {}),
    ...(step.neighbour && !step.neighbour.closed ? { neighbour: step.neighbour } : {}),
    ...(twoLinks(config, slot) ? { multipath: config.multipath! } : {}),
  };
  return {
    tiers,
    ...(step.onto ? { move: { onto: step.onto[0]! } } : {}),
    recovery: { policy: config.recovery.reload ? 'reload' : 'fail', materialize: config.recovery.materialize, codec: config.codec },
    ...(config.overlap ? { overlapKvWake: true } : {}),
    onWarning: step.onWarning,
  };
}

/**
 * The flows' seams for a step: the fake checkpoint driver of the options, and in an overlapped
 * swap the gate between its engines (`beforeKvWake`: the other engine's sleep; `afterCopy`: the
 * word that this one's copy is over; `beforeSleep`: the other engine's copy landing).
 * @internal
 */
export function flowHooks(config: SwapConfig, gate: FlowHooks = {}): FlowHooks {
  return { ...(config.checkpoint ? { checkpoint: config.checkpoint } : {}), ...gate };
}

/**
 * suspendEngine's options for a suspend: `gpu` (tier 0 keeps its weights), `neighbour` (a park, with
 * its admission rule).
 * @internal
 */
export function suspendOptions(
  config: SwapConfig,
  slot: Slot,
  step: {
    captureIfNeeded: boolean;
    gpu?: GpuTier | undefined;
    neighbour?: NeighbourParkOptions | undefined;
    onWarning: (message: string) => void;
  },
): EngineSuspendOptions {
  const { spec } = slot;
  const capture = { ...(spec.check ? { check: spec.check } : {}), ...(config.codec === 'vsnap-c1' ? { codec: config.codec } : {}) };
  return {
    captureIfNeeded: step.captureIfNeeded,
    tiers: { ...(config.ram ? { ram: config.ram } : {}), ...(step.gpu ? { gpu: step.gpu } : {}), ...(step.neighbour ? { neighbour: step.neighbour } : {}) },
    ...(spec.deepSuspend ? { deep: true } : {}),
    ...(Object.keys(capture).length > 0 ? { capture } : {}),
    ...(step.neighbour ? { onWarning: step.onWarning } : {}),
  };
}

/** The engine's own tier 0 (vLLM's release_kv_cache_memory), for a suspend and for the wake after it. @internal */
export const KEPT_BY_ENGINE = { tiers: { engine: true } } as const satisfies EngineSuspendOptions & EngineRestoreOptions;
