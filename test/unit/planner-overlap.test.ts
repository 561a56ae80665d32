import { describe, expect, it } from 'vitest';

import { overlapFits, plan, usage, type Action, type PlanEngine, type PlanInput } from '../../src/swap/planner.js';

const GB = 1e9;

function engine(name: string, over: Partial<PlanEngine> = {}): PlanEngine {
  return { name, state: 'asleep', leases: 0, lastUsed: 0, pinned: false, devices: [0], memoryBytes: 10 * GB, asleepBytes: 1 * GB, residentBytes: 0, ...over };
}

function input(engines: PlanEngine[], over: Partial<PlanInput> = {}): PlanInput {
  return { engines, budgets: { 0: 19 * GB }, tier0: false, now: 1_000_000, overlap: true, ...over };
}

/** What each device holds while a compound swap's weights stream in (the old engine still awake, the new one's weights woken), and after it. */
function swapUsage(s: PlanInput, action: Extract<Action, { kind: 'swap' }>): { during: Record<number, number>; after: Record<number, number> } {
  const a = s.engines.find((e) => e.name === action.suspend)!;
  const b = s.engines.find((e) => e.name === action.wake)!;
  const during = usage({ ...s, engines: s.engines.map((e) => (e === b ? { ...e, asleepBytes: Math.max(e.asleepBytes + e.residentBytes, e.asleepBytes + e.swapWeightsBytes!), residentBytes: 0 } : e)) });
  const keep = action.keepResident ? (a.weightsBytes ?? a.memoryBytes) : 0;
  const after = usage({ ...s, engines: s.engines.map((e) => (e === b ? { ...e, state: 'awake' as const } : e === a ? { ...e, state: 'asleep' as const, residentBytes: keep } : e)) });
  return { during, after };
}

const withinBudget = (s: PlanInput, used: Record<number, number>) => Object.entries(used).every(([d, n]) => n <= s.budgets[Number(d)]!);

describe('planner: a suspend for another engine runs as one overlapped swap when the weights fit beside it', () => {
  it("b's weights fit beside awake a (10 + 1 + 8 <= 19 GB), and b fits once a sleeps: one swap step", () => {
    const s = input([engine('a', { state: 'awake', lastUsed: 1 }), engine('b', { waitingSince: 5, swapWeightsBytes: 8 * GB })]);
    const action = plan(s);
    expect(action).toEqual({ kind: 'swap', suspend: 'a', keepResident: false, wake: 'b', overlap: 'weights' });
    const { during, after } = swapUsage(s, action as Extract<Action, { kind: 'swap' }>);
    expect(during[0]).toBe(19 * GB);
    expect(withinBudget(s, during)).toBe(true);
    expect(withinBudget(s, after)).toBe(true);
  });

  it("b's weights do not fit beside awake a (10 + 1 + 10 > 19 GB): two steps, suspend then wake", () => {
    const s = input([engine('a', { state: 'awake' }), engine('b', { waitingSince: 5, swapWeightsBytes: 10 * GB })]);
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('no overlap without the weights bytes, or when the controller turns it off', () => {
    expect(plan(input([engine('a', { state: 'awake' }), engine('b', { waitingSince: 5 })]))).toMatchObject({ kind: 'suspend' });
    expect(plan(input([engine('a', { state: 'awake' }), engine('b', { waitingSince: 5, swapWeightsBytes: 2 * GB })], { overlap: false }))).toMatchObject({ kind: 'suspend' });
    expect(plan(input([engine('a', { state: 'awake' }), engine('b', { waitingSince: 5, swapWeightsBytes: 2 * GB })], { overlap: undefined }))).toMatchObject({ kind: 'suspend' });
  });

  it('no overlap when even after the suspend the engine would not fit (more steps needed): the plain suspend comes first', () => {
    // 3 awake engines of 6 GB on 20 GB: b (12 GB) needs two suspends; its weights (2 GB) would fit now.
    const s = input(
      [
        engine('a', { state: 'awake', memoryBytes: 6 * GB, asleepBytes: 0, lastUsed: 1 }),
        engine('c', { state: 'awake', memoryBytes: 6 * GB, asleepBytes: 0, lastUsed: 2 }),
        engine('d', { state: 'awake', memoryBytes: 6 * GB, asleepBytes: 0, lastUsed: 3 }),
        engine('b', { waitingSince: 5, memoryBytes: 12 * GB, asleepBytes: 0, swapWeightsBytes: 2 * GB }),
      ],
    );
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('only devices the woken engine uses count; a victim on another device frees nothing there', () => {
    const s = input([engine('a', { state: 'awake', devices: [0, 1] }), engine('b', { waitingSince: 5, devices: [1], swapWeightsBytes: 8 * GB })], { budgets: { 0: 19 * GB, 1: 19 * GB } });
    const action = plan(s);
    expect(action).toMatchObject({ kind: 'swap', suspend: 'a', wake: 'b' });
    const { during, after } = swapUsage(s, action as Extract<Action, { kind: 'swap' }>);
    expect(withinBudget(s, during) && withinBudget(s, after)).toBe(true);
  });

  it('with tier 0: the victim keeps its weights only if b still fits after; the swap accounts for them', () => {
    const engines = [engine('a', { state: 'awake', weightsBytes: 4 * GB, swapWeightsBytes: 4 * GB }), engine('b', { waitingSince: 5, swapWeightsBytes: 4 * GB, weightsBytes: 4 * GB })];
    const roomy = input(engines, { tier0: true, budgets: { 0: 19 * GB } });
    const action = plan(roomy) as Extract<Action, { kind: 'swap' }>;
    expect(action).toEqual({ kind: 'swap', suspend: 'a', keepResident: true, wake: 'b', overlap: 'weights' });
    const { during, after } = swapUsage(roomy, action);
    expect(after[0]).toBe(1 * GB + 4 * GB + 10 * GB);
    expect(withinBudget(roomy, during) && withinBudget(roomy, after)).toBe(true);
    // tighter (14 GB): a may not keep its weights, and b's weights (1 + 4) no longer fit beside awake a (10): a plain suspend
    expect(plan(input(engines, { tier0: true, budgets: { 0: 14 * GB } }))).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('b with its weights already in tier 0 (resident): they count once, not twice', () => {
    const s = input([engine('a', { state: 'awake' }), engine('b', { waitingSince: 5, residentBytes: 9 * GB, swapWeightsBytes: 9 * GB })], { budgets: { 0: 20 * GB }, tier0: true });
    // a 10 + b asleep 1 + held 9 = 20: fits while a is awake
    expect(overlapFits(s, s.engines[0]!, s.engines[1]!, false)).toBe(true);
  });

  it('never for a deep-suspended engine that may move, nor one the engine kept itself, nor from an engine not awake', () => {
    const a = engine('a', { state: 'awake' });
    const b = engine('b', { waitingSince: 5, swapWeightsBytes: 2 * GB });
    const s = input([a, b]);
    expect(overlapFits(s, a, { ...b, movableTo: [1] }, false)).toBe(false);
    expect(overlapFits(s, a, { ...b, keptByEngine: true }, false)).toBe(false);
    expect(overlapFits(s, { ...a, state: 'suspending' }, b, false)).toBe(false);
    expect(overlapFits(s, a, b, false)).toBe(true);
  });
});
