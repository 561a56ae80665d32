import { describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import type { EngineSpec, SwapConfig } from '../../src/swap/options.js';
import { planInput } from '../../src/swap/plan-input.js';
import {
  answered,
  demoted,
  engineState,
  keptAsleep,
  lockHold,
  newSlot,
  processesBack,
  roomMade,
  suspended,
  suspendFailed,
  suspending,
  unreachable,
  viewOf,
  wakeFailed,
  waking,
  woke,
  type Slot,
} from '../../src/swap/state.js';

// The slot's state machine on its own: what each transition leaves, and what the planner sees of it.

const GB = 1e9;
const client = new EngineClient({ baseUrl: 'http://127.0.0.1:9' });
const spec = (over: Partial<EngineSpec> = {}): EngineSpec => ({ name: 'a', client, snapshot: 'a', devices: [0], memoryBytes: 10 * GB, asleepBytes: 2 * GB, ...over });
const config = { budgets: { 0: 20 * GB, 1: 20 * GB }, recovery: { reload: true, materialize: 'async' }, overlap: true, gpu: undefined, defaultModel: undefined } as unknown as SwapConfig;
const planned = (slot: Slot) => planInput(config, [slot], undefined).engines[0]!;

describe('swap state: transitions', () => {
  it('a deep engine: 0 bytes while deep; moved, it runs (and counts) on its new GPU, its spec unchanged', () => {
    const slot = newSlot(spec({ deepSuspend: true, movableTo: [1] }));
    expect(slot.state).toEqual({ kind: 'deep' });
    expect(planned(slot)).toMatchObject({ state: 'asleep', asleepBytes: 0, movableTo: [1], devices: [0] });
    waking(slot);
    woke(slot, [1]);
    expect(slot.state).toEqual({ kind: 'awake' });
    expect(slot.devices).toEqual([1]);
    expect(slot.spec.devices).toEqual([0]); // the configuration is never rewritten
    expect(planned(slot).devices).toEqual([1]);
    expect(viewOf(slot, 0, 0).devices).toEqual([1]);
  });

  it('a failed wake goes back to what it woke from; after its processes came back, to a level-2 sleep where it runs now', () => {
    const slot = newSlot(spec({ deepSuspend: true, movableTo: [1] }));
    waking(slot);
    answered(slot, true); // read back asleep
    wakeFailed(slot, 'hydrate failed', false);
    expect(slot.state).toEqual({ kind: 'deep' });
    expect(viewOf(slot, 0, 0).error).toBe('hydrate failed');
    waking(slot);
    processesBack(slot, [1]);
    answered(slot, true);
    wakeFailed(slot, 'hydrate failed', false);
    expect(slot.state).toEqual({ kind: 'asleep', tier: 'store' });
    expect(slot.devices).toEqual([1]);
    expect(planned(slot)).toMatchObject({ asleepBytes: 2 * GB, movableTo: undefined }); // holds its context, no longer movable
  });

  it('a wake read back awake (unverified weights) is failed, never awake', () => {
    const slot = newSlot(spec());
    waking(slot);
    answered(slot, false);
    wakeFailed(slot, 'the check failed', true);
    expect(slot.state).toMatchObject({ kind: 'failed', error: 'the check failed' });
    expect(engineState(slot.state)).toBe('failed');
  });

  it('the engine that keeps its weights counts as awake while asleep, and is still so after it stopped answering a while', () => {
    const slot = newSlot(spec());
    answered(slot, false);
    suspending(slot);
    keptAsleep(slot);
    expect(planned(slot)).toMatchObject({ state: 'asleep', keptByEngine: true });
    unreachable(slot, 'connection refused');
    expect(slot.state).toMatchObject({ kind: 'failed', asleep: { kind: 'asleep', tier: 'engine' } });
    answered(slot, true);
    expect(slot.state).toEqual({ kind: 'asleep', tier: 'engine' });
    waking(slot);
    woke(slot, undefined);
    expect(planned(slot).keptByEngine).toBe(false);
  });

  it('tier 0: a hold that failed the dirty check is locked until the engine wakes; a demotion releases the label', () => {
    const slot = newSlot(spec({ weightsBytes: 4 * GB }));
    suspending(slot);
    suspended(slot, { kind: 'asleep', tier: 'gpu' });
    lockHold(slot, 'they differ');
    expect(planned(slot).holdLocked).toBe(true);
    expect(viewOf(slot, 0, 0).error).toBe('tier-0 weights kept, not demoted: they differ');
    waking(slot);
    expect(planned(slot).holdLocked).toBe(true);
    woke(slot, undefined);
    expect(planned(slot).holdLocked).toBe(false);
    suspended(slot, { kind: 'asleep', tier: 'gpu' });
    demoted(slot, 'ram');
    expect(slot.state).toEqual({ kind: 'asleep', tier: 'ram' });
  });

  it('a failed deep suspend rolls back to a level-2 sleep and cools off; an overlapped wake counts its holding until the other engine sleeps', () => {
    const deep = newSlot(spec({ deepSuspend: true }));
    answered(deep, false);
    suspending(deep);
    answered(deep, true);
    suspendFailed(deep, 'checkpoint failed', true, 123);
    expect(deep.state).toEqual({ kind: 'asleep', tier: 'store' });
    expect(deep.retryAt).toBe(123);
    const slot = newSlot(spec());
    waking(slot, 3 * GB);
    expect(planned(slot).memoryBytes).toBe(3 * GB);
    roomMade(slot);
    expect(planned(slot).memoryBytes).toBe(10 * GB);
  });
});
