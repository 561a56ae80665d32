import type { RamTier } from '../cache/ram-tier.js';
import type { EngineClient } from '../engine/engine-client.js';
import type { RegistrySource } from '../registry/source.js';
import type { RegionStore } from '../store/region-store.js';
import type { SwapControllerOptions, SwapEngine } from '../swap/types.js';
import type { ServeConfig } from './config.js';

/*
 * The one place where the serve configuration (GiB and seconds, as an operator writes them)
 * becomes the SwapController's description of the engines (bytes and milliseconds). Nothing else
 * in vsnap serve converts a unit.
 */

const GiB = 2 ** 30;

/** Bytes of a GiB figure of the configuration. @internal */
export const bytesOf = (gib: number): number => Math.floor(gib * GiB);

/** Each GPU's budget, in bytes, by ordinal. @internal */
export function budgetsOf(config: ServeConfig): Record<number, number> {
  return Object.fromEntries(Object.entries(config.gpus).map(([d, g]) => [Number(d), bytesOf(g.budgetGiB)]));
}

/** The engine of one configured model. @internal */
export function swapEngineOf(name: string, config: ServeConfig, client: EngineClient, from: RegistrySource | undefined): SwapEngine {
  const m = config.models[name]!;
  return {
    name,
    client,
    snapshot: m.snapshot ?? name,
    ...(from ? { from } : {}),
    devices: m.gpus,
    memoryBytes: bytesOf(m.memoryGiB),
    asleepBytes: bytesOf(m.asleepGiB),
    pinned: m.pinned,
    ...(m.deepSuspend ? { deepSuspend: true } : {}),
    ...(m.check ? { check: m.check } : {}),
    ...(m.ttlSeconds !== undefined ? { idleTtlMs: m.ttlSeconds * 1000 } : {}),
    ...(m.group ? { group: m.group } : {}),
  };
}

/** The SwapController's options for a configuration. @internal */
export function controllerOptionsOf(
  config: ServeConfig,
  parts: {
    readonly store: RegionStore;
    readonly clients: ReadonlyMap<string, EngineClient>;
    readonly sources: ReadonlyMap<string, RegistrySource>;
    readonly ram: RamTier | undefined;
    /** Engines still booting: counted awake until released. */
    readonly booting: readonly string[];
  },
): SwapControllerOptions {
  return {
    store: parts.store,
    engines: Object.keys(config.models).map((name) => swapEngineOf(name, config, parts.clients.get(name)!, parts.sources.get(name))),
    budgets: budgetsOf(config),
    booting: parts.booting,
    tiers: {
      ...(parts.ram ? { ram: parts.ram } : {}),
      ...(config.neighbourTier ? { neighbour: { device: config.neighbourTier.gpu, budgetBytes: bytesOf(config.neighbourTier.budgetGiB) } } : {}),
      ...(config.multipath ? { multipath: { neighbour: config.multipath.gpu } } : {}),
    },
    recovery: { policy: config.recovery.mode, materialize: config.recovery.materialize },
    ...(config.codec !== 'off' ? { codec: config.codec } : {}),
    ...(config.defaultModel ? { defaultModel: config.defaultModel } : {}),
    queue: { limit: config.queue.limit, timeoutMs: config.queue.timeoutSeconds * 1000 },
  };
}
