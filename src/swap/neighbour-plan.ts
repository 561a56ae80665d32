import { usage, type PlanEngine, type PlanInput, type PlanNeighbour } from './planner.js';

export type { PlanNeighbour } from './planner.js';

/*
 * The park decision of the neighbour-GPU tier, pure like the planner (whose steps count the
 * parked weights against their GPU's budget and evict them first when a wake or the budget needs
 * that memory: planner.ts): a suspend parks an engine's weights only when they fit both the
 * tier's own budget and the GPU's, evicting the tier's least recently used entries.
 */

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
