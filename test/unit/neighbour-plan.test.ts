import { describe, expect, it } from 'vitest';

import { planPark, type PlanNeighbour } from '../../src/swap/neighbour-plan.js';
import { plan, usage, type Action, type PlanEngine, type PlanInput } from '../../src/swap/planner.js';

// The planner's neighbour-tier decisions, pure: parked bytes count on the neighbour GPU, a wake
// (or the budget) that needs that room evicts them first, and a park fits both budgets.

const GB = 1e9;

function engine(name: string, over: Partial<PlanEngine> = {}): PlanEngine {
  return { name, state: 'asleep', leases: 0, lastUsed: 0, pinned: false, devices: [0], memoryBytes: 10 * GB, asleepBytes: 0, residentBytes: 0, ...over };
}

function nb(parked: Array<[string, number]>, over: Partial<PlanNeighbour> = {}): PlanNeighbour {
  return { device: 1, budgetBytes: 40 * GB, parked: parked.map(([id, bytes]) => ({ id, bytes })), ...over };
}

function input(engines: PlanEngine[], neighbour: PlanNeighbour | undefined, over: Partial<PlanInput> = {}): PlanInput {
  return { engines, budgets: { 0: 30 * GB, 1: 30 * GB }, tier0: false, now: 1_000_000, neighbour, ...over };
}

describe('planner: the neighbour tier', () => {
  it('parked bytes count on the neighbour GPU', () => {
    const u = usage(input([engine('a', { state: 'awake' }), engine('b', { devices: [1], state: 'awake' })], nb([['s1', 6 * GB], ['s2', 4 * GB]])));
    expect(u).toEqual({ 0: 10 * GB, 1: 20 * GB });
  });

  it('a wake on the neighbour GPU that lacks room evicts the least recently parked first, before suspending anyone', () => {
    const s = input(
      [engine('c', { devices: [1], state: 'awake', lastUsed: 1 }), engine('d', { devices: [1], waitingSince: 5 })],
      nb([['old', 6 * GB], ['new', 6 * GB]]),
    );
    // 10 awake + 12 parked + 10 wanted = 32 > 30: evicting 'old' (6) makes room without suspending c
    expect(plan(s)).toEqual({ kind: 'evictParked', id: 'old', device: 1, for: 'd' });
    const after = input([...s.engines], nb([['new', 6 * GB]]));
    expect(plan(after)).toEqual({ kind: 'wake', engine: 'd' });
  });

  it('parked weights go before tier-0 holdings and awake engines, even when they alone are not enough', () => {
    const s = input(
      [engine('c', { devices: [1], state: 'awake', lastUsed: 1 }), engine('r', { devices: [1], residentBytes: 8 * GB, lastUsed: 0 }), engine('d', { devices: [1], waitingSince: 5, memoryBytes: 15 * GB })],
      nb([['p', 3 * GB]]), // 10 + 8 + 3 + 15 = 36 > 30: evicting p (3) is not enough, r (8) goes next
      { tier0: true },
    );
    expect(plan(s)).toMatchObject({ kind: 'evictParked', id: 'p', for: 'd' });
    expect(plan(input([...s.engines], nb([]), { tier0: true }))).toMatchObject({ kind: 'demote', engine: 'r', for: 'd' });
  });

  it('a wake on another GPU leaves the parked weights alone', () => {
    const s = input([engine('a', { state: 'awake', lastUsed: 1 }), engine('b', { waitingSince: 5, memoryBytes: 25 * GB })], nb([['p', 20 * GB]]));
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('a wake that fits with the parked weights in place evicts nothing', () => {
    const s = input([engine('d', { devices: [1], waitingSince: 5 })], nb([['p', 20 * GB]]));
    expect(plan(s)).toEqual({ kind: 'wake', engine: 'd' });
  });

  it('a device over its budget gives back parked weights first', () => {
    const s = input([engine('c', { devices: [1], state: 'awake' }), engine('e', { devices: [1], state: 'awake' })], nb([['p', 12 * GB]]));
    expect(plan(s)).toEqual({ kind: 'evictParked', id: 'p', device: 1 });
  });

  it('planPark: parks when both budgets allow, evicting the least recently used entries to fit', () => {
    const engines = [engine('a', { state: 'suspending' }), engine('c', { devices: [1], state: 'awake' })];
    expect(planPark(input(engines, nb([])), 'a', 10 * GB)).toEqual({ park: true, evict: [] });
    // the tier's own budget (40): 35 parked + 10 needs 5 more: the oldest (6) goes
    expect(planPark(input(engines, nb([['o1', 6 * GB], ['o2', 6 * GB], ['o3', 23 * GB]]), { budgets: { 0: 30 * GB, 1: 80 * GB } }), 'a', 10 * GB)).toEqual({ park: true, evict: ['o1'] });
    // the GPU's budget (30) beside engine c (10): 15 parked + 10 = 35 > 30: evict o1 (6) -> 29
    expect(planPark(input(engines, nb([['o1', 6 * GB], ['o2', 9 * GB]])), 'a', 10 * GB)).toEqual({ park: true, evict: ['o1'] });
  });

  it('planPark: refuses, evicting nothing, what could never fit', () => {
    const engines = [engine('a'), engine('c', { devices: [1], state: 'awake', memoryBytes: 25 * GB }), engine('t', { devices: [0, 1] }), engine('n', { devices: [1] })];
    const s = input(engines, nb([['o1', 3 * GB]]));
    expect(planPark(s, 'a', 10 * GB)).toMatchObject({ park: false, evict: [], reason: expect.stringMatching(/GPU 1 has 5000000000 bytes/) });
    expect(planPark(input(engines, nb([], { budgetBytes: 5 * GB })), 'a', 6 * GB)).toMatchObject({ park: false, evict: [], reason: expect.stringMatching(/tier's budget/) });
    expect(planPark(s, 't', GB)).toMatchObject({ park: false, reason: expect.stringMatching(/one GPU other than 1/) });
    expect(planPark(s, 'n', GB)).toMatchObject({ park: false });
    expect(planPark(input(engines, undefined), 'a', GB)).toMatchObject({ park: false });
  });

  it('planPark: never evicts the copy of the engine the suspend makes room for (it is about to be restored from it)', () => {
    const parked: PlanNeighbour = { device: 1, budgetBytes: 12 * GB, parked: [{ id: 'b@1', bytes: 8 * GB, engine: 'b' }, { id: 'c@1', bytes: 2 * GB, engine: 'c' }] };
    const s = input([engine('a', { state: 'suspending' }), engine('b', { waitingSince: 1 })], parked);
    expect(planPark(s, 'a', 6 * GB, 'b')).toMatchObject({ park: false, evict: [], reason: expect.stringMatching(/parked copy of 'b'/) });
    expect(planPark(s, 'a', 3 * GB, 'b')).toEqual({ park: true, evict: ['c@1'] });
    expect(planPark(s, 'a', 6 * GB)).toEqual({ park: true, evict: ['b@1'] });
  });

  it('planPark: a GPU without a budget (no engines there) is bounded by the tier budget alone', () => {
    const s = input([engine('a')], nb([['o1', 30 * GB]]), { budgets: { 0: 30 * GB } });
    expect(planPark(s, 'a', 15 * GB)).toEqual({ park: true, evict: ['o1'] });
  });

  it('never lets a device exceed its budget, and parked weights never cost a wake: random swaps with parking', () => {
    let seed = 7;
    const rand = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), (seed >>> 12) % n);
    for (let round = 0; round < 200; round++) {
      const budgets = { 0: (20 + rand(20)) * GB, 1: (20 + rand(20)) * GB };
      let engines: PlanEngine[] = Array.from({ length: 2 + rand(4) }, (_, i) =>
        engine(`e${i}`, { devices: [rand(2)], memoryBytes: (8 + rand(12)) * GB, asleepBytes: rand(2) * GB, lastUsed: i }),
      );
      let parked: Array<{ id: string; bytes: number }> = [];
      const tierBudget = (10 + rand(30)) * GB;
      const state = (): PlanInput => input(engines, { device: 1, budgetBytes: tierBudget, parked }, { budgets, now: 1e9 });
      const within = (s: PlanInput): void => {
        const u = usage(s);
        for (const d of [0, 1] as const) expect(u[d], `round ${round} device ${d}`).toBeLessThanOrEqual(budgets[d]);
        expect(parked.reduce((n, p) => n + p.bytes, 0)).toBeLessThanOrEqual(tierBudget);
      };
      for (let req = 0; req < 12; req++) {
        const target = engines[rand(engines.length)]!;
        engines = engines.map((e) => (e === target ? { ...e, waitingSince: req } : e));
        for (let steps = 0; steps < 30; steps++) {
          const a: Action = plan(state());
          if (a.kind === 'grant') {
            engines = engines.map((e) => (e.name === a.engine ? { ...e, waitingSince: undefined, lastUsed: 100 + req } : e));
            break;
          }
          if (a.kind === 'reject' && a.code === 'E_BUSY') {
            // parked weights never cost a wake: with none parked it would be refused all the same
            expect(plan(input(engines, { device: 1, budgetBytes: tierBudget, parked: [] }, { budgets, now: 1e9 }))).toMatchObject({ kind: 'reject' });
          }
          if (a.kind === 'reject' || a.kind === 'wait' || a.kind === 'idle' || a.kind === 'overBudget') {
            engines = engines.map((e) => ({ ...e, waitingSince: undefined }));
            break;
          }
          if (a.kind === 'wake') {
            engines = engines.map((e) => (e.name === a.engine ? { ...e, state: 'awake' } : e));
            within(state()); // the wake never overruns a budget: parked weights were evicted first
          } else if (a.kind === 'evictParked') {
            parked = parked.filter((p) => p.id !== a.id);
          } else if (a.kind === 'suspend') {
            engines = engines.map((e) => (e.name === a.engine ? { ...e, state: 'suspending' } : e));
            const bytes = (2 + rand(10)) * GB;
            const decision = planPark(state(), a.engine, bytes);
            if (decision.park) {
              parked = [...parked.filter((p) => !decision.evict.includes(p.id)), { id: `${a.engine}@${round}.${req}.${steps}`, bytes }];
            } else {
              expect(decision.evict).toEqual([]);
            }
            engines = engines.map((e) => (e.name === a.engine ? { ...e, state: 'asleep' } : e));
            within(state()); // a park never overruns the neighbour GPU's budget nor the tier's
          } else {
            throw new Error(`unexpected ${a.kind}`);
          }
        }
      }
    }
  });
});
