import { describe, expect, it } from 'vitest';

import { mayKeepResident, plan, usage, type PlanEngine, type PlanInput } from '../../src/swap/planner.js';

const GB = 1e9;

function engine(name: string, over: Partial<PlanEngine> = {}): PlanEngine {
  return { name, state: 'asleep', leases: 0, lastUsed: 0, pinned: false, devices: [0], memoryBytes: 10 * GB, asleepBytes: 0, residentBytes: 0, ...over };
}

function input(engines: PlanEngine[], over: Partial<PlanInput> = {}): PlanInput {
  return { engines, budgets: { 0: 15 * GB }, tier0: false, now: 1_000_000, ...over };
}

describe('planner: the next step from the state alone', () => {
  it('nothing to do: idle', () => {
    expect(plan(input([engine('a', { state: 'awake' }), engine('b')]))).toEqual({ kind: 'idle' });
  });

  it('grants waiters of an awake engine', () => {
    expect(plan(input([engine('a', { state: 'awake', waitingSince: 5 })]))).toEqual({ kind: 'grant', engine: 'a' });
  });

  it('wakes a wanted engine that fits', () => {
    expect(plan(input([engine('a', { waitingSince: 5 })]))).toEqual({ kind: 'wake', engine: 'a' });
  });

  it('makes room by suspending the least recently used idle engine, for the wanted one', () => {
    const s = input([engine('a', { state: 'awake', lastUsed: 9 }), engine('c', { state: 'awake', lastUsed: 3, devices: [0] }), engine('b', { waitingSince: 5 })], {
      budgets: { 0: 25 * GB },
    });
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'c', keepResident: false, reason: 'room', for: 'b' });
  });

  it('never suspends an engine serving requests: waits for a release instead', () => {
    expect(plan(input([engine('a', { state: 'awake', leases: 1 }), engine('b', { waitingSince: 5 })]))).toEqual({ kind: 'wait' });
  });

  it('refuses (E_BUSY) when even suspending every unpinned engine would not make room', () => {
    const action = plan(input([engine('a', { state: 'awake', pinned: true }), engine('b', { waitingSince: 5 })]));
    expect(action).toMatchObject({ kind: 'reject', engine: 'b', code: 'E_BUSY' });
  });

  it('a target whose snapshot cannot bring it back is refused before anyone is suspended for it', () => {
    const action = plan(input([engine('a', { state: 'awake' }), engine('b', { waitingSince: 5, unrestorable: 'its snapshot failed its restore with E_CHECKSUM' })]));
    expect(action).toMatchObject({ kind: 'reject', engine: 'b', code: 'E_NOT_RESTORABLE' });
    expect((action as { message: string }).message).toMatch(/E_CHECKSUM/);
  });

  it('serves the oldest request first; a younger one is only granted or refused while the oldest waits', () => {
    const engines = [
      engine('a', { state: 'awake', leases: 1 }),
      engine('b', { waitingSince: 1 }),
      engine('c', { waitingSince: 2, devices: [1], memoryBytes: GB }),
      engine('d', { waitingSince: 3, unrestorable: 'gone' }),
    ];
    // b waits for a to be released; c would fit on device 1 but must not overtake b's turn with a swap
    expect(plan(input(engines, { budgets: { 0: 15 * GB, 1: 2 * GB } }))).toMatchObject({ kind: 'reject', engine: 'd' });
    expect(plan(input(engines.slice(0, 3), { budgets: { 0: 15 * GB, 1: 2 * GB } }))).toEqual({ kind: 'wait' });
  });

  it('demotes the oldest tier-0 holding when it is in the way (before suspending anyone newer)', () => {
    const s = input(
      [engine('a', { state: 'asleep', residentBytes: 8 * GB, lastUsed: 1 }), engine('b', { state: 'awake', lastUsed: 5, memoryBytes: 6 * GB }), engine('c', { waitingSince: 9, memoryBytes: 6 * GB })],
      { budgets: { 0: 15 * GB }, tier0: true },
    );
    expect(plan(s)).toEqual({ kind: 'demote', engine: 'a', for: 'c' });
  });

  it('suspends (keeping weights) before demoting when demoting alone could not make room: more weights stay on the GPU', () => {
    // one awake (10 GB, 2 GB of weights) and one holding (2 GB) in 15 GB; c needs 10 GB: b must be
    // suspended anyway, and keeping its weights leaves a's holding in place (2 + 2 + 10 <= 15)
    const s = input(
      [
        engine('a', { state: 'asleep', residentBytes: 2 * GB, weightsBytes: 2 * GB, lastUsed: 1 }),
        engine('b', { state: 'awake', lastUsed: 5, weightsBytes: 2 * GB }),
        engine('c', { waitingSince: 9, weightsBytes: 2 * GB }),
      ],
      { budgets: { 0: 15 * GB }, tier0: true },
    );
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'b', keepResident: true, reason: 'room', for: 'c' });
  });

  it('never demotes a holding whose weights failed the dirty check (holdLocked): suspends someone else', () => {
    const s = input(
      [
        engine('a', { state: 'asleep', residentBytes: 4 * GB, lastUsed: 1, holdLocked: true }),
        engine('b', { state: 'awake', lastUsed: 5, memoryBytes: 6 * GB }),
        engine('c', { waitingSince: 9, memoryBytes: 6 * GB }),
      ],
      { budgets: { 0: 15 * GB }, tier0: true },
    );
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'b', keepResident: false, reason: 'room', for: 'c' });
  });

  it('an engine that kept its own weights (keptByEngine) counts as awake in the budget', () => {
    const s = input([engine('a', { state: 'asleep', keptByEngine: true, memoryBytes: 10 * GB }), engine('b', { memoryBytes: 6 * GB })]);
    expect(usage(s)[0]).toBe(10 * GB);
  });

  it('keeps a suspended engine in tier 0 only while its weights still leave room for the one woken', () => {
    const a = engine('a', { state: 'awake', weightsBytes: 4 * GB, memoryBytes: 10 * GB });
    const b = engine('b', { waitingSince: 1, memoryBytes: 10 * GB });
        expect(mayKeepResident(input([a, b], { budgets: { 0: 14 * GB }, tier0: true }), a, b)).toBe(true);
    expect(mayKeepResident(input([a, b], { budgets: { 0: 13 * GB }, tier0: true }), a, b)).toBe(false);
    expect(mayKeepResident(input([a, b], { budgets: { 0: 14 * GB }, tier0: false }), a, b)).toBe(false);
  });

  it('brings every device within budget first: a tier-0 holding, then the least recently used idle engine', () => {
    const over = [engine('a', { state: 'awake', lastUsed: 2 }), engine('b', { state: 'awake', lastUsed: 1 }), engine('c', { residentBytes: 2 * GB })];
    expect(plan(input(over, { budgets: { 0: 21 * GB } }))).toEqual({ kind: 'demote', engine: 'c' });
    expect(plan(input(over.slice(0, 2)))).toEqual({ kind: 'suspend', engine: 'b', keepResident: false, reason: 'budget' });
    expect(plan(input([engine('a', { state: 'awake', pinned: true }), engine('b', { state: 'awake', pinned: true })]))).toMatchObject({ kind: 'overBudget', device: 0 });
  });

  it('suspends engines idle past their TTL, never the default model, and wakes the default when nothing else is awake', () => {
    const ttl = input([engine('a', { state: 'awake', idleTtlMs: 100, lastUsed: 1_000_000 - 101 }), engine('b')], { defaultModel: 'b' });
    expect(plan(ttl)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'idle' });
    expect(plan(input([engine('a', { state: 'awake', idleTtlMs: 100, lastUsed: 1_000_000 - 50 }), engine('b')], { defaultModel: 'b' }))).toEqual({ kind: 'idle' });
    expect(plan(input([engine('a'), engine('b')], { defaultModel: 'b' }))).toEqual({ kind: 'wake', engine: 'b' });
    expect(plan(input([engine('a'), engine('b', { unrestorable: 'x' })], { defaultModel: 'b' }))).toEqual({ kind: 'idle' });
    expect(plan(input([engine('a', { state: 'failed' }), engine('b', { state: 'failed' })], { defaultModel: 'b' }))).toEqual({ kind: 'idle' });
  });

  it('wakes pinned engines when nobody waits', () => {
    expect(plan(input([engine('a', { pinned: true })]))).toEqual({ kind: 'wake', engine: 'a' });
  });

  it('leaves an engine whose swap just failed alone in the background, but a request still tries it', () => {
    const now = 1_000_000;
    expect(plan(input([engine('a', { pinned: true, retryAt: now + 1 })]))).toEqual({ kind: 'idle' });
    expect(plan(input([engine('a', { pinned: true, retryAt: now - 1 })]))).toEqual({ kind: 'wake', engine: 'a' });
    expect(plan(input([engine('a', { retryAt: now + 1, waitingSince: 1 })]))).toEqual({ kind: 'wake', engine: 'a' });
    expect(plan(input([engine('a', { state: 'awake', idleTtlMs: 1, retryAt: now + 1 })]))).toEqual({ kind: 'idle' });
    // a victim that failed to suspend is not picked again at once: the next one is, or the request waits
    const room = [engine('a', { state: 'awake', lastUsed: 1, retryAt: now + 1 }), engine('c', { state: 'awake', lastUsed: 2 }), engine('b', { waitingSince: 5 })];
    expect(plan(input(room, { budgets: { 0: 25 * GB } }))).toMatchObject({ kind: 'suspend', engine: 'c' });
    expect(plan(input([room[0]!, room[2]!]))).toEqual({ kind: 'wait' });
    expect(plan(input([engine('a', { state: 'awake', retryAt: now + 1 }), engine('b', { state: 'awake' })]))).toMatchObject({ kind: 'suspend', engine: 'b', reason: 'budget' });
  });

  it('one engine of a group awake at a time', () => {
    const s = input([engine('a', { state: 'awake', group: 'g', devices: [1], memoryBytes: GB }), engine('b', { group: 'g', waitingSince: 1, memoryBytes: GB })], { budgets: { 0: 100 * GB, 1: 100 * GB } });
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('accounts tier-0 weights and asleep bytes per device', () => {
    const u = usage(input([engine('a', { state: 'awake', devices: [0, 1] }), engine('b', { asleepBytes: GB, residentBytes: 2 * GB, devices: [1] })], { budgets: { 0: 1, 1: 1 } }));
    expect(u).toEqual({ 0: 10 * GB, 1: 13 * GB });
  });
});
