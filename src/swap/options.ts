import type { Registry } from 'prom-client';

import type { RamTier } from '../cache/ram-tier.js';
import { NeighbourTier } from '../cache/neighbour-tier.js';
import type { GpuTier } from '../cache/gpu-tier.js';
import { invalidArgument } from '../errors.js';
import type { CheckpointBackend } from '../flows/deep.js';
import type { MaterializePolicy } from '../flows/recovery.js';
import { checkOptions } from '../options.js';
import { checkStoreCodec, type StoreCodec } from '../snapshot/coded-capture.js';
import type { RegionStore } from '../store/region-store.js';
import type { MultipathOptions } from '../transfer/multipath.js';
import type { SwapControllerOptions, SwapEngine, SwapHooks, SwapNeighbourOptions } from './types.js';

/*
 * SwapControllerOptions, checked and resolved once, at create: every default filled in, every
 * unknown key refused (with the option it is likely a typo of).
 */

const OPTIONS = ['store', 'engines', 'budgets', 'tiers', 'recovery', 'overlap', 'captureIfNeeded', 'codec', 'defaultModel', 'queue', 'metrics', 'booting'];
const TIERS = ['ram', 'gpu', 'neighbour', 'multipath'];
const ENGINE = ['name', 'client', 'snapshot', 'from', 'devices', 'memoryBytes', 'asleepBytes', 'pinned', 'idleTtlMs', 'group', 'weightsBytes', 'deepSuspend', 'movableTo', 'check'];

/** An engine as the controller keeps it, defaults filled in: its one internal description. @internal */
export interface EngineSpec extends SwapEngine {
  readonly snapshot: string;
  readonly devices: readonly number[];
  readonly asleepBytes: number;
}

/** The controller's options, resolved. @internal */
export interface SwapConfig {
  readonly store: RegionStore;
  readonly engines: readonly EngineSpec[];
  readonly budgets: Readonly<Record<number, number>>;
  readonly ram: RamTier | undefined;
  readonly gpu: GpuTier | undefined;
  readonly neighbour: SwapNeighbourOptions | undefined;
  readonly multipath: MultipathOptions | undefined;
  /** `reload`: a snapshot that cannot be used is reloaded past; then `materialize`. */
  readonly recovery: { readonly reload: boolean; readonly materialize: MaterializePolicy };
  readonly overlap: boolean;
  readonly captureIfNeeded: boolean;
  /** How its captures write the store's blobs. */
  readonly codec: StoreCodec;
  readonly defaultModel: string | undefined;
  readonly queue: { readonly limit: number; readonly timeoutMs: number };
  readonly metrics: Registry | undefined;
  readonly checkpoint: CheckpointBackend | undefined;
  /** Engines `vsnap serve` is still booting: held awake until released. */
  readonly booting: ReadonlySet<string>;
}

/** Checks every key and value of the options, and fills in the defaults. Throws E_INVALID_ARGUMENT. @internal */
export function resolveOptions(options: SwapControllerOptions, seams: SwapHooks = {}): SwapConfig {
  checkOptions('SwapController options', options, OPTIONS);
  checkOptions('SwapController options.tiers', options.tiers, TIERS);
  checkOptions('SwapController options.queue', options.queue, ['limit', 'timeoutMs']);
  const neighbour = options.tiers?.neighbour;
  if (neighbour !== undefined && !(neighbour instanceof NeighbourTier)) checkOptions('SwapController options.tiers.neighbour', neighbour, ['device', 'budgetBytes']);
  const engines: EngineSpec[] = [];
  for (const e of options.engines) {
    checkOptions(`SwapController engine '${e?.name}'`, e, ENGINE);
    if (engines.some((x) => x.name === e.name)) invalidArgument('engines', 'engines with distinct names', e.name);
    if (!Number.isSafeInteger(e.memoryBytes) || e.memoryBytes <= 0) invalidArgument(`${e.name}.memoryBytes`, 'a positive byte count', e.memoryBytes);
    const spec: EngineSpec = { ...e, snapshot: e.snapshot ?? e.name, devices: e.devices ?? [0], asleepBytes: e.asleepBytes ?? 0 };
    for (const d of [...spec.devices, ...(e.movableTo ?? [])]) {
      if (options.budgets[d] === undefined) invalidArgument('budgets', `a budget for device ${d} (used by ${e.name})`, options.budgets);
    }
    if (e.movableTo?.length && (!e.deepSuspend || spec.devices.length !== 1)) invalidArgument(`${e.name}.movableTo`, 'an engine on one GPU with deepSuspend', e.movableTo);
    engines.push(spec);
  }
  if (options.defaultModel !== undefined && !engines.some((e) => e.name === options.defaultModel)) invalidArgument('defaultModel', 'one of the engines', options.defaultModel);
  for (const name of options.booting ?? []) if (!engines.some((e) => e.name === name)) invalidArgument('booting', 'names of the engines', name);
  return {
    store: options.store,
    engines,
    budgets: options.budgets,
    ram: options.tiers?.ram,
    gpu: options.tiers?.gpu,
    neighbour,
    multipath: options.tiers?.multipath,
    recovery: recovery(options.recovery),
    overlap: options.overlap ?? true,
    captureIfNeeded: options.captureIfNeeded ?? true,
    codec: checkStoreCodec(options.codec),
    defaultModel: options.defaultModel,
    queue: { limit: options.queue?.limit ?? 64, timeoutMs: options.queue?.timeoutMs ?? 120_000 },
    metrics: options.metrics,
    checkpoint: seams.checkpoint,
    booting: new Set(options.booting ?? []),
  };
}

/** The recovery option: `reload` with materialize `async` unless it says otherwise. */
function recovery(r: SwapControllerOptions['recovery']): SwapConfig['recovery'] {
  if (typeof r === 'object' && r !== null) checkOptions('SwapController options.recovery', r, ['policy', 'materialize']);
  const { policy = 'reload', materialize = 'async' } = typeof r === 'object' && r !== null ? r : { policy: r };
  if (policy !== 'fail' && policy !== 'reload') invalidArgument('recovery', "'reload', 'fail' or { policy, materialize }", r);
  if (materialize !== 'off' && materialize !== 'async' && materialize !== 'required') invalidArgument('recovery.materialize', "'off', 'async' or 'required'", materialize);
  return { reload: policy === 'reload', materialize };
}
