import { heldAsleep, usage, type Action, type PlanEngine, type PlanInput } from './planner.js';

/*
 * The planner's decisions about the neighbour-GPU tier, pure like the rest of the planner: its
 * parked weights count against its GPU's budget, they are the first thing given back when a wake
 * (or the budget) needs that GPU's memory, and a suspend parks an engine's weights only when they
 * fit both the tier's own budget and the GPU's, evicting the tier's least recently used entries.
 */

/** The neighbour tier as the planner sees it. @internal */
export interface PlanNeighbour {
  /** The GPU holding the parked weights. */
  readonly device: number;
  /** The tier's own byte budget. */
  readonly budgetBytes: number;
  /** What is parked, least recently used first (with the engine it was parked for, when known). */
  readonly parked: ReadonlyArray<{ readonly id: string; readonly bytes: number; readonly engine?: string | undefined }>;
}

/** What a suspend's park may do: park or not, and which entries to evict first. @internal */
export interface ParkDecision {
  readonly park: boolean;
  /** Entries to evict before parking (least recently used first); empty when not parking. */
  readonly evict: readonly string[];
  /** Why not, when not parking. */
  readonly reason?: string;
}

/** Whether `e` can have its weights parked in the tier: on one GPU, not the tier's own. @internal */
export function parkable(nb: PlanNeighbour, e: Pick<PlanEngine, 'devices'>): boolean {
  return e.devices.length === 1 && e.devices[0] !== nb.device;
}

/**
 * A wake of `target` that lacks room on the neighbour's GPU evicts the least recently used parked
 * entry first, before any engine is suspended or tier-0 weights demoted.
 */
export function evictParkedFor(input: PlanInput, target: PlanEngine, used: Readonly<Record<number, number>>): Action | undefined {
  const nb = input.neighbour;
  if (!nb?.parked.length || !target.devices.includes(nb.device)) return undefined;
  const budget = input.budgets[nb.device];
  if (budget === undefined || (used[nb.device] ?? 0) - heldAsleep(target) + target.memoryBytes <= budget) return undefined;
  return { kind: 'evictParked', id: nb.parked[0]!.id, device: nb.device, for: target.name };
}

/** A device over its budget gives back parked weights first. */
export function evictParkedOver(input: PlanInput, device: number): Action | undefined {
  const nb = input.neighbour;
  if (!nb?.parked.length || nb.device !== device) return undefined;
  return { kind: 'evictParked', id: nb.parked[0]!.id, device };
}

/**
 * Whether a suspend of `engine` may park `bytes` of its weights, and what to evict first: the
 * tier's least recently used entries, until the park fits the tier's budget and leaves the
 * neighbour GPU within its budget (parked weights never take room the engines there are
 * budgeted for). The copy of `forEngine` (the one the suspend makes room for, about to be
 * restored from it) is never evicted for this. Evicts nothing when it cannot park.
 * @internal
 */
export function planPark(input: PlanInput, engine: string, bytes: number, forEngine?: string): ParkDecision {
  const nb = input.neighbour;
  const no = (reason: string): ParkDecision => ({ park: false, evict: [], reason });
  if (!nb) return no('no neighbour tier');
  const e = input.engines.find((x) => x.name === engine);
  if (!e) return no(`no engine '${engine}'`);
  if (!parkable(nb, e)) return no(`it runs on GPU(s) ${e.devices.join(', ')}: parking needs an engine on one GPU other than ${nb.device}`);
  if (bytes > nb.budgetBytes) return no(`${bytes} bytes exceed the tier's budget of ${nb.budgetBytes}`);
  const budget = input.budgets[nb.device];
  const parkedTotal = nb.parked.reduce((n, p) => n + p.bytes, 0);
  const others = (usage(input)[nb.device] ?? 0) - parkedTotal; // what the engines on that GPU hold
  if (budget !== undefined && others + bytes > budget) return no(`GPU ${nb.device} has ${Math.max(0, budget - others)} bytes of its budget left beside its engines`);
  const evict: string[] = [];
  let kept = parkedTotal;
  const fits = (): boolean => kept + bytes <= nb.budgetBytes && (budget === undefined || others + kept + bytes <= budget);
  for (const p of nb.parked) {
    if (fits()) break;
    if (forEngine !== undefined && p.engine === forEngine) continue;
    evict.push(p.id);
    kept -= p.bytes;
  }
  if (!fits()) return no(`it would evict the parked copy of '${forEngine}', which the suspend makes room for`);
  return { park: true, evict };
}
