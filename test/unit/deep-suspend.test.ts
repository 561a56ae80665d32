import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { native } from '../../src/native/index.js';
import { deepRestoreRanks, deepSuspendRanks, nativeCheckpointBackend } from '../../src/flows/deep.js';
import { FakeCheckpointDriver } from '../helpers/fake-checkpoint.js';
import { rejection } from '../helpers/rejection.js';

const RANKS = [
  { rank: 0, pid: 1000 },
  { rank: 1, pid: 1001 },
];

describe('deep suspend state machine (fake driver)', () => {
  it('locks every rank before checkpointing any, restores every rank before unlocking any', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    const times = await deepSuspendRanks(RANKS, d);
    expect(Object.keys(times)).toEqual(['checkState', 'lock', 'checkpoint']);
    expect(d.calls.filter((c) => !c.startsWith('state'))).toEqual(['lock:1000', 'lock:1001', 'checkpoint:1000', 'checkpoint:1001']);
    expect([...d.states.values()]).toEqual(['checkpointed', 'checkpointed']);
    // a second suspend of a deep engine does nothing
    d.calls.length = 0;
    await deepSuspendRanks(RANKS, d);
    expect(d.calls.filter((c) => !c.startsWith('state'))).toEqual([]);

    d.calls.length = 0;
    const back = await deepRestoreRanks(RANKS, d);
    expect(Object.keys(back!)).toEqual(['restore', 'unlock']);
    expect(d.calls.filter((c) => !c.startsWith('state'))).toEqual(['restore:1000', 'restore:1001', 'unlock:1000', 'unlock:1001']);
    expect(d.notRunning()).toEqual([]);
    // an engine that runs is not deep: nothing to do
    expect(await deepRestoreRanks(RANKS, d)).toBeUndefined();
  });

  it('a lock timeout of rank 1 of 2 unlocks rank 0: nothing is left locked', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.fail('lock', 1001, 'timeout');
    const err = await rejection(deepSuspendRanks(RANKS, d));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ step: 'lock', reason: 'timeout', ranks: [1], stranded: [] });
    expect(err.message).toMatch(/rank 1 \(pid 1001\)/);
    expect(err.message).toMatch(/put back to running/);
    expect(d.notRunning()).toEqual([]);
    expect(d.calls).toContain('unlock:1000');
    expect(d.calls.some((c) => c.startsWith('checkpoint'))).toBe(false);
  });

  it('a failed checkpoint of one rank restores and unlocks the other', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.fail('checkpoint', 1001, 'unsupported');
    const err = await rejection(deepSuspendRanks(RANKS, d));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ step: 'checkpoint', ranks: [1], stranded: [] });
    expect(d.notRunning()).toEqual([]);
    expect(d.calls).toEqual(expect.arrayContaining(['restore:1000', 'unlock:1000', 'unlock:1001']));
  });

  it('permission denied: named, nothing changed', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.fail('lock', 1000, 'permission');
    const err = await rejection(deepSuspendRanks(RANKS, d));
    expect(err.details).toMatchObject({ reason: 'permission', step: 'lock' });
    expect(d.notRunning()).toEqual([]);
  });

  it('a rollback that cannot undo a rank says so (details.stranded) and to restart the engine', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.fail('checkpoint', 1001, 'driver');
    d.fail('restore', 1000, 'driver');
    const err = await rejection(deepSuspendRanks(RANKS, d));
    expect(err.details.stranded).toHaveLength(1);
    expect(err.message).toMatch(/Restart the engine/);
  });

  it('API missing: E_CHECKPOINT_UNSUPPORTED before anything changes; a restore then has nothing to do', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.unsupported = true;
    const err = await rejection(deepSuspendRanks(RANKS, d));
    expect(err.code).toBe('E_CHECKPOINT_UNSUPPORTED');
    expect(d.calls.every((c) => c.startsWith('state'))).toBe(true);
    expect(await deepRestoreRanks(RANKS, d)).toBeUndefined();
  });

  it('a worker that is not running refuses the suspend, naming it', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.states.set(1001, 'locked');
    const err = await rejection(deepSuspendRanks(RANKS, d));
    expect(err.details).toMatchObject({ reason: 'state', ranks: [1] });
    expect(d.calls.every((c) => c.startsWith('state'))).toBe(true);
  });

  it('a restore failure keeps the restored ranks locked; a retry finishes the restore', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    await deepSuspendRanks(RANKS, d);
    d.fail('restore', 1001, 'driver');
    const err = await rejection(deepRestoreRanks(RANKS, d));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ step: 'restore', ranks: [1] });
    expect(err.message).toMatch(/Retry the restore/);
    expect(d.states.get(1000)).toBe('locked');
    expect(d.states.get(1001)).toBe('checkpointed');
    expect(d.calls.some((c) => c.startsWith('unlock'))).toBe(false);
    await deepRestoreRanks(RANKS, d);
    expect(d.notRunning()).toEqual([]);
  });

  it('a worker that exited while checkpointed: says restart, and lets the survivor run', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    await deepSuspendRanks(RANKS, d);
    d.exit(1001);
    const err = await rejection(deepRestoreRanks(RANKS, d));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ reason: 'gone', ranks: [1] });
    expect(err.message).toMatch(/restart the engine/);
    expect(d.notRunning()).toEqual([]);
  });

  it('an unreadable state (not a gone process) stops the restore before anything changes', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    await deepSuspendRanks(RANKS, d);
    d.fail('state', 1000, 'permission');
    d.calls.length = 0;
    const err = await rejection(deepRestoreRanks(RANKS, d));
    expect(err.details).toMatchObject({ step: 'state', reason: 'permission' });
    expect(d.calls.every((c) => c.startsWith('state'))).toBe(true);
  });
});

describe('detection by driver state', () => {
  it('pids this process cannot read never fail a plain restore: deep only where a rank is locked or checkpointed', async () => {
    const d = new FakeCheckpointDriver([1000, 1001]);
    d.fail('state', 1000, 'permission');
    d.exit(1001);
    expect(await deepRestoreRanks(RANKS, d)).toBeUndefined();
    expect(d.calls.every((c) => c.startsWith('state'))).toBe(true);
  });
});

describe('the real binding without a driver', () => {
  it('every call rejects E_CHECKPOINT_UNSUPPORTED, saying why', async (ctx) => {
    const status = await native().cudaStatus();
    if (status.checkpointApi) ctx.skip(); // a machine with the API: the GPU suite covers it
    const b = nativeCheckpointBackend();
    for (const call of [() => b.state(process.pid), () => b.lock(process.pid, 100), () => b.checkpoint(process.pid), () => b.restore(process.pid), () => b.unlock(process.pid)]) {
      const err = await rejection(call());
      expect(err.code).toBe('E_CHECKPOINT_UNSUPPORTED');
      expect(err.message).toMatch(status.available ? /r570/ : /CUDA is unavailable/);
    }
    expect(() => native().checkpointLock(-1, 0)).toThrow(/positive process id/);
    // and a restore of an engine on such a machine has nothing to undo
    expect(await deepRestoreRanks([{ rank: 0, pid: process.pid }], b)).toBeUndefined();
  });
});
