/*
 * The phases of a restore, one typed list per route: a report lists, as they ran, those of its
 * route that ran (EngineRestoreReport.phases; `route` says which list).
 */

/**
 * The route a restore took:
 * - `filled`: from the RAM tier or the store into memory made here, adopted by the engine's wake;
 * - `mapped`: into the engine's own weights, woken, exported and mapped here (a move onto other
 *   GPUs, two links, the neighbour tier, a plugin that cannot describe its regions while asleep);
 * - `adopted`: tier 0's held memory mapped back by the engine's wake;
 * - `kept`: the engine's own tier 0 (its KV cache woken);
 * - `reloaded`: the engine loaded its weights again (a recovery).
 * @public
 */
export type RestoreRoute = 'filled' | 'mapped' | 'adopted' | 'kept' | 'reloaded';

/**
 * A phase of a restore (see {@link RestoreRoute} for which route has which):
 * `open`, `deep.restore`, `deep.unlock` (a deep-suspended engine's processes brought back),
 * `sleep` (a model swap), `prepare` (the snapshot opened, the engine read), then the route's own,
 * then the wake's end: `awaitRoom` (a swap's wait for the other engine's sleep), `wakeKvCache`,
 * `wakeKvCacheWait` (what of a KV wake started beside the hydrate was left), `resetPrefixCache`,
 * `expectedResponse`.
 * @public
 */
export type RestorePhase =
  | 'open'
  | 'deep.restore'
  | 'deep.unlock'
  | 'sleep'
  | 'prepare'
  | 'adoptWeights'
  | 'allocate'
  | 'hydrate'
  | 'verifyDigests'
  | 'wakeWeightsWait'
  | 'describe'
  | 'validate'
  | 'allocateRest'
  | 'wakeWeights'
  | 'export'
  | 'map'
  | 'reloadWeights'
  | 'awaitRoom'
  | 'wakeKvCache'
  | 'wakeKvCacheWait'
  | 'resetPrefixCache'
  | 'expectedResponse'
  | 'materialize';

const START = ['open', 'deep.restore', 'deep.unlock', 'sleep', 'prepare'] as const;
const WAKE = ['awaitRoom', 'wakeKvCache', 'wakeKvCacheWait', 'resetPrefixCache', 'expectedResponse'] as const;

/**
 * Each route's phases in the order they run. A tier-0 attempt that fell through leaves
 * `adoptWeights` before the route that served. `describe`, `validate`, `allocateRest` and
 * `wakeWeights` of `filled` run beside its hydrate (the report's `overlapped`), and are listed after
 * `wakeWeightsWait`, what of them the restore still waited for.
 * @internal
 */
export const RESTORE_PHASES = {
  filled: [...START, 'adoptWeights', 'allocate', 'hydrate', 'verifyDigests', 'wakeWeightsWait', 'describe', 'validate', 'allocateRest', 'wakeWeights', ...WAKE],
  mapped: [...START, 'adoptWeights', 'wakeWeights', 'export', 'validate', 'map', 'hydrate', 'verifyDigests', ...WAKE],
  adopted: [...START, 'adoptWeights', ...WAKE],
  kept: [...START, 'wakeKvCache', 'resetPrefixCache', 'expectedResponse'],
  reloaded: [...START, 'adoptWeights', 'allocate', 'hydrate', 'wakeWeights', 'export', 'validate', 'map', 'reloadWeights', ...WAKE, 'materialize'],
} as const satisfies Record<RestoreRoute, readonly RestorePhase[]>;

/** Seconds per phase of a restore, in the order they ran (each one a {@link RestorePhase}). @public */
export type RestorePhases = Readonly<Partial<Record<RestorePhase, number>>> & Readonly<Record<string, number>>;
