import { describe, expect, it } from 'vitest';

import { plan, type PlanEngine, type PlanInput } from '../../src/swap/planner.js';

const GB = 1e9;

function engine(name: string, over: Partial<PlanEngine> = {}): PlanEngine {
  return { name, state: 'asleep', leases: 0, lastUsed: 0, pinned: false, devices: [0], memoryBytes: 10 * GB, asleepBytes: 0, residentBytes: 0, ...over };
}

function input(engines: PlanEngine[], budgets: Record<number, number>): PlanInput {
  return { engines, budgets, tier0: false, now: 1_000_000 };
}

describe('planner: a deep-suspended engine wakes on another GPU of the same kind when its own is full', () => {
  const busyOn0 = engine('a', { state: 'awake', lastUsed: 5 });

  it('its GPU full, another with room: wake it there, suspending nobody', () => {
    const s = input([busyOn0, engine('b', { waitingSince: 1, movableTo: [1] })], { 0: 15 * GB, 1: 15 * GB });
    expect(plan(s)).toEqual({ kind: 'wake', engine: 'b', onto: [1] });
  });

  it('room on its own GPU: wakes where it is (no move)', () => {
    const s = input([engine('b', { waitingSince: 1, movableTo: [1] })], { 0: 15 * GB, 1: 15 * GB });
    expect(plan(s)).toEqual({ kind: 'wake', engine: 'b' });
  });

  it('of several GPUs with room, the one with the most room left', () => {
    const s = input(
      [busyOn0, engine('c', { state: 'awake', devices: [1], memoryBytes: 4 * GB }), engine('d', { state: 'awake', devices: [2], memoryBytes: 2 * GB }), engine('b', { waitingSince: 1, movableTo: [1, 2, 3] })],
      { 0: 15 * GB, 1: 15 * GB, 2: 15 * GB, 3: 11 * GB },
    );
    expect(plan(s)).toEqual({ kind: 'wake', engine: 'b', onto: [2] });
  });

  it('no GPU it may move to has room: it makes room on its own GPU as before', () => {
    const s = input([busyOn0, engine('c', { state: 'awake', devices: [1], memoryBytes: 8 * GB }), engine('b', { waitingSince: 1, movableTo: [1] })], { 0: 15 * GB, 1: 15 * GB });
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('an engine that may not move (no movableTo, or not deep) makes room on its own GPU', () => {
    const s = input([busyOn0, engine('b', { waitingSince: 1 })], { 0: 15 * GB, 1: 15 * GB });
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });

  it('a group mate awake keeps it in line (never moved around the group rule)', () => {
    const s = input([engine('a', { state: 'awake', group: 'g', lastUsed: 5 }), engine('b', { waitingSince: 1, group: 'g', movableTo: [1] })], { 0: 15 * GB, 1: 15 * GB });
    expect(plan(s)).toEqual({ kind: 'suspend', engine: 'a', keepResident: false, reason: 'room', for: 'b' });
  });
});
