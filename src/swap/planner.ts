/**
 * The SwapController's decisions, as a pure function of its state: which one step to take next.
 * No engine, clock or I/O here, so every decision is unit-tested on its own; the controller's
 * executor carries the steps out one at a time.
 */

/**
 * What an engine is doing.
 * @public
 */
export type EngineState = 'awake' | 'asleep' | 'waking' | 'suspending' | 'failed';

/** One engine as the planner sees it. @internal */
export interface PlanEngine {
  readonly name: string;
  readonly state: EngineState;
  /** Requests using it now. */
  readonly leases: number;
  /** When its oldest waiting request arrived (undefined: nobody waits). */
  readonly waitingSince?: number | undefined;
  readonly lastUsed: number;
  readonly pinned: boolean;
  readonly devices: readonly number[];
  /** Per device, while awake. */
  readonly memoryBytes: number;
  /** Per device, while asleep. */
  readonly asleepBytes: number;
  /** Per device: the weights tier 0 holds for it now (0: none). */
  readonly residentBytes: number;
  /** Per device: what tier 0 would hold for it (undefined: tier 0 cannot keep it). */
  readonly weightsBytes?: number | undefined;
  readonly group?: string | undefined;
  readonly idleTtlMs?: number | undefined;
  /** Why its snapshot cannot bring it back (a failed check or restore), if so. */
  readonly unrestorable?: string | undefined;
  /** After a failed swap: not tried again in the background (nor suspended) before this time. */
  readonly retryAt?: number | undefined;
  /** Suspended by the engine itself with its weights kept (its own tier 0): counted as awake. */
  readonly keptByEngine?: boolean | undefined;
  /** Its tier-0 weights differ from its snapshot (or could not be checked): never demoted. */
  readonly holdLocked?: boolean | undefined;
  /**
   * Deep-suspended on one GPU: the other GPUs (of the same kind) its process may be restored
   * onto when its own has no room (undefined or empty: it wakes only where it is).
   */
  readonly movableTo?: readonly number[] | undefined;
  /** Per device: its weights' bytes for an overlapped swap (`weightsBytes`, else from its snapshot; undefined: unknown, no overlap). */
  readonly swapWeightsBytes?: number | undefined;
}

/** The neighbour tier as the planner sees it. @internal */
export interface PlanNeighbour {
  /** The GPU holding the parked weights. */
  readonly device: number;
  /** The tier's own byte budget. */
  readonly budgetBytes: number;
  /** What is parked, least recently used first (with the engine it was parked for, when known). */
  readonly parked: ReadonlyArray<{ readonly id: string; readonly bytes: number; readonly engine?: string | undefined }>;
}

/** @internal */
export interface PlanInput {
  readonly engines: readonly PlanEngine[];
  readonly budgets: Readonly<Record<number, number>>;
  readonly defaultModel?: string | undefined;
  /** Whether tier 0 is configured. */
  readonly tier0: boolean;
  readonly now: number;
  /** Whether a suspend for another engine may run as one overlapped swap. */
  readonly overlap?: boolean | undefined;
  /** The neighbour-GPU tier, when configured: its parked bytes count on its device. */
  readonly neighbour?: PlanNeighbour | undefined;
}

/** One step. `for`: the engine the step makes room for. @internal */
export type Action =
  | { readonly kind: 'grant'; readonly engine: string }
  | { readonly kind: 'wake'; readonly engine: string; readonly onto?: readonly number[] }
  | { readonly kind: 'suspend'; readonly engine: string; readonly keepResident: boolean; readonly reason: 'room' | 'budget' | 'idle'; readonly for?: string }
  /** A suspend of `suspend` for `wake`, overlapped: `wake`'s weights come back while `suspend` is still awake (swapEngines' `weights`). */
  | { readonly kind: 'swap'; readonly suspend: string; readonly keepResident: boolean; readonly wake: string; readonly overlap: 'weights' }
  | { readonly kind: 'demote'; readonly engine: string; readonly for?: string }
  | { readonly kind: 'reject'; readonly engine: string; readonly code: 'E_BUSY' | 'E_NOT_RESTORABLE'; readonly message: string }
  | { readonly kind: 'overBudget'; readonly device: number; readonly message: string }
  | { readonly kind: 'evictParked'; readonly id: string; readonly device: number; readonly for?: string }
  | { readonly kind: 'wait' }
  | { readonly kind: 'idle' };

const asleep = (e: PlanEngine): boolean => e.state === 'asleep' || e.state === 'failed';
/** What an asleep engine still holds per device (an engine that kept its weights frees only its KV cache). */
const heldAsleep = (e: PlanEngine): number => (e.keptByEngine ? e.memoryBytes : e.asleepBytes + e.residentBytes);

/** GPU memory accounted to the engines, per device (tier-0 weights and the neighbour tier's parked weights included). @internal */
export function usage(input: Pick<PlanInput, 'engines' | 'budgets'> & { readonly neighbour?: PlanNeighbour | undefined }): Record<number, number> {
  const out: Record<number, number> = {};
  for (const d of Object.keys(input.budgets)) out[Number(d)] = 0;
  for (const e of input.engines) {
    const held = asleep(e) ? heldAsleep(e) : e.memoryBytes;
    for (const d of e.devices) out[d] = (out[d] ?? 0) + held;
  }
  const nb = input.neighbour;
  if (nb?.parked.length) out[nb.device] = (out[nb.device] ?? 0) + nb.parked.reduce((n, p) => n + p.bytes, 0);
  return out;
}

/** Whether suspending `victim` may keep its weights in tier 0 and still leave room for `next`. @internal */
export function mayKeepResident(input: PlanInput, victim: PlanEngine, next?: PlanEngine): boolean {
  const weights = victim.weightsBytes;
  if (!input.tier0 || weights === undefined) return false;
  const used = usage(input);
  return victim.devices.every((d) => {
    let after = (used[d] ?? 0) - victim.memoryBytes + victim.asleepBytes + weights;
    if (next?.devices.includes(d)) after += next.memoryBytes - heldAsleep(next);
    return after <= input.budgets[d]!;
  });
}

/**
 * Whether suspending `victim` for `target` may run as one overlapped swap: on every device of
 * `target`, its weights fit beside `victim` still awake (while they stream in, `target` holds what
 * it holds asleep plus its weights), and once `victim` sleeps, all of `target` fits. Needs
 * `target`'s weights bytes, and a `target` restored from its snapshot (not a deep-suspended one,
 * nor one the engine itself kept). @internal
 */
export function overlapFits(input: PlanInput, victim: PlanEngine, target: PlanEngine, keepResident: boolean): boolean {
  const weights = target.swapWeightsBytes;
  if (!input.overlap || weights === undefined || target.state !== 'asleep' || target.keptByEngine || target.movableTo !== undefined) return false;
  if (victim.state !== 'awake' || victim.keptByEngine) return false;
  const used = usage(input);
  const victimAfter = victim.asleepBytes + (keepResident ? (victim.weightsBytes ?? victim.memoryBytes) : 0);
  return target.devices.every((d) => {
    const base = (used[d] ?? 0) - heldAsleep(target);
    const during = base + Math.max(heldAsleep(target), target.asleepBytes + weights);
    const after = base + target.memoryBytes - (victim.devices.includes(d) ? victim.memoryBytes - victimAfter : 0);
    return during <= input.budgets[d]! && after <= input.budgets[d]!;
  });
}

/** A suspend for `target`, as one overlapped swap when that fits. */
function suspendFor(input: PlanInput, victim: PlanEngine, target: PlanEngine, keepResident: boolean): Action {
  if (overlapFits(input, victim, target, keepResident)) return { kind: 'swap', suspend: victim.name, keepResident, wake: target.name, overlap: 'weights' };
  return { kind: 'suspend', engine: victim.name, keepResident, reason: 'room', for: target.name };
}

/** A swap of it failed a moment ago: leave it alone for now (requests for it still try). */
const cooling = (input: PlanInput, e: PlanEngine): boolean => e.retryAt !== undefined && e.retryAt > input.now;
const byLastUsed = (a: PlanEngine, b: PlanEngine): number => a.lastUsed - b.lastUsed;
const shares = (a: PlanEngine, b: PlanEngine): boolean => a.devices.some((d) => b.devices.includes(d));

/** The step that brings `target` up: wake it, make room for it, wait for a request to finish, or refuse. */
function bringUp(input: PlanInput, target: PlanEngine): Action {
  if (target.state === 'awake') return { kind: 'grant', engine: target.name };
  if (target.unrestorable !== undefined) {
    return { kind: 'reject', engine: target.name, code: 'E_NOT_RESTORABLE', message: `'${target.name}' cannot be restored: ${target.unrestorable}` };
  }
  const used = usage(input);
  const others = input.engines.filter((e) => e !== target);
  const groupMates = target.group === undefined ? [] : others.filter((e) => e.group === target.group && !asleep(e));
  const fits = groupMates.length === 0 && target.devices.every((d) => (used[d] ?? 0) - heldAsleep(target) + target.memoryBytes <= input.budgets[d]!);
  if (fits) return { kind: 'wake', engine: target.name };
  const elsewhere = groupMates.length === 0 ? placeElsewhere(input, target, used) : undefined;
  if (elsewhere !== undefined) return { kind: 'wake', engine: target.name, onto: [elsewhere] };
  // Parked copies are the cheapest room to take back (the RAM tier or the store still has them).
  const parked = evictParkedFor(input, target, used);
  if (parked) return parked;
  // Who is in the way: idle awake engines (suspended, keeping their weights in tier 0 if they
  // still leave room) and tier-0 holdings (demoted), least recently used first.
  const awake = others.filter((e) => e.state === 'awake' && !e.pinned && (groupMates.includes(e) || shares(e, target)));
  const residents = others.filter((e) => asleep(e) && e.residentBytes > 0 && !e.holdLocked && shares(e, target));
  const idle = awake.filter((e) => e.leases === 0 && !cooling(input, e)).sort(byLastUsed);
  // When demoting every holding in the way would still leave no room, an awake engine has to be
  // suspended anyway: suspend it first (keeping its weights if they still fit), so the holdings
  // are demoted only if room is still missing after that.
  const demotable = (d: number): number => residents.filter((e) => e.devices.includes(d)).reduce((n, e) => n + e.residentBytes, 0);
  const roomByDemoting = groupMates.length === 0 && target.devices.every((d) => (used[d] ?? 0) - demotable(d) - heldAsleep(target) + target.memoryBytes <= input.budgets[d]!);
  if (!roomByDemoting && idle.length > 0) {
    // It may keep its weights if they fit once the holdings older than it are demoted (the next
    // steps demote those, least recently used first, while room is still missing).
    const victim = idle[0]!;
    const older = new Set(residents.filter((e) => e.lastUsed <= victim.lastUsed));
    const relaxed = { ...input, engines: input.engines.map((e) => (older.has(e) ? { ...e, residentBytes: 0 } : e)) };
    return suspendFor(input, victim, target, mayKeepResident(relaxed, victim, target));
  }
  const victim = [...idle, ...residents].sort(byLastUsed)[0];
  if (victim && asleep(victim)) return { kind: 'demote', engine: victim.name, for: target.name };
  if (victim) return suspendFor(input, victim, target, mayKeepResident(input, victim, target));
  if (awake.length === 0) {
    return { kind: 'reject', engine: target.name, code: 'E_BUSY', message: `'${target.name}' cannot fit its GPU budget even with every unpinned engine suspended` };
  }
  return { kind: 'wait' }; // every engine in the way serves requests (or just failed to suspend): wait
}

/**
 * A deep-suspended engine whose own GPU has no room wakes on another of the same kind where it
 * fits without suspending anyone: the one with the most room left (then the lowest ordinal).
 */
function placeElsewhere(input: PlanInput, target: PlanEngine, used: Record<number, number>): number | undefined {
  if (!target.movableTo?.length || target.devices.length !== 1 || target.state !== 'asleep') return undefined;
  const room = (d: number): number => input.budgets[d]! - (used[d] ?? 0) - target.memoryBytes;
  return target.movableTo
    .filter((d) => !target.devices.includes(d) && input.budgets[d] !== undefined && room(d) >= 0)
    .sort((a, b) => room(b) - room(a) || a - b)[0];
}

/**
 * Neighbour tier: a wake of `target` that lacks room on the neighbour's GPU evicts the least
 * recently used parked entry first, before any engine is suspended or tier-0 weights demoted.
 */
function evictParkedFor(input: PlanInput, target: PlanEngine, used: Readonly<Record<number, number>>): Action | undefined {
  const nb = input.neighbour;
  if (!nb?.parked.length || !target.devices.includes(nb.device)) return undefined;
  const budget = input.budgets[nb.device];
  if (budget === undefined || (used[nb.device] ?? 0) - heldAsleep(target) + target.memoryBytes <= budget) return undefined;
  return { kind: 'evictParked', id: nb.parked[0]!.id, device: nb.device, for: target.name };
}

/** Neighbour tier: a device over its budget gives back parked weights first. */
function evictParkedOver(input: PlanInput, device: number): Action | undefined {
  const nb = input.neighbour;
  if (!nb?.parked.length || nb.device !== device) return undefined;
  return { kind: 'evictParked', id: nb.parked[0]!.id, device };
}

/** The step that brings every device within its budget, if one is over. */
function planBudget(input: PlanInput): Action | undefined {
  const used = usage(input);
  const over = Object.entries(used).find(([d, n]) => n > input.budgets[Number(d)]!);
  if (!over) return undefined;
  const device = Number(over[0]);
  const parked = evictParkedOver(input, device);
  if (parked) return parked;
  const resident = input.engines.filter((e) => asleep(e) && e.residentBytes > 0 && !e.holdLocked && e.devices.includes(device)).sort(byLastUsed)[0];
  if (resident) return { kind: 'demote', engine: resident.name };
  const awake = input.engines.filter((e) => e.state === 'awake' && !e.pinned && e.devices.includes(device));
  const victim = awake.filter((e) => e.leases === 0 && !cooling(input, e)).sort(byLastUsed)[0];
  if (victim) return { kind: 'suspend', engine: victim.name, keepResident: false, reason: 'budget' };
  if (awake.length) return { kind: 'wait' };
  return { kind: 'overBudget', device, message: `device ${device} is over its budget with only pinned engines awake: raise the budget or unpin one` };
}

/**
 * The next step: first bring every device within budget; then serve the oldest waiting request;
 * then, with nobody waiting, wake pinned engines, suspend engines idle past their TTL, and wake
 * the default model when nothing else is awake.
 * @internal
 */
export function plan(input: PlanInput): Action {
  const budget = planBudget(input);
  if (budget) return budget;
  const wanted = input.engines.filter((e) => e.waitingSince !== undefined).sort((a, b) => a.waitingSince! - b.waitingSince!);
  for (const target of wanted) {
    const action = bringUp(input, target);
    // Oldest first; while it waits for a request to finish, younger ones are only granted or refused.
    if (action.kind !== 'wait' || target !== wanted[0]) {
      if (target === wanted[0] || action.kind === 'grant' || action.kind === 'reject') return action;
    }
  }
  if (wanted.length) return { kind: 'wait' };
  for (const e of input.engines) {
    if (e.pinned && e.state === 'asleep' && e.unrestorable === undefined && !cooling(input, e)) {
      const action = bringUp(input, e);
      if (action.kind !== 'reject' && action.kind !== 'wait') return action;
    }
  }
  const expired = input.engines
    .filter((e) => e.state === 'awake' && !e.pinned && e.leases === 0 && !cooling(input, e) && e.idleTtlMs !== undefined && input.now - e.lastUsed > e.idleTtlMs && e.name !== input.defaultModel)
    .sort(byLastUsed)[0];
  if (expired) return { kind: 'suspend', engine: expired.name, keepResident: mayKeepResident(input, expired), reason: 'idle' };
  const fallback = input.engines.find((e) => e.name === input.defaultModel);
  if (fallback && fallback.state === 'asleep' && fallback.unrestorable === undefined && !cooling(input, fallback) && input.engines.every((e) => e.pinned || asleep(e))) {
    const action = bringUp(input, fallback);
    if (action.kind !== 'reject' && action.kind !== 'wait') return action;
  }
  return { kind: 'idle' };
}
