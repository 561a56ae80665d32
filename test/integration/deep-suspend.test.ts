import { readdirSync, readlinkSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import { native } from '../../src/native/index.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { restoreEngineWith } from '../../src/flows/restore.js';
import { suspendEngineWith } from '../../src/flows/suspend.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { askCapital, dirtyCheckPhases, startEngine, type TestEngine } from '../helpers/engine.js';
import { FakeCheckpointDriver } from '../helpers/fake-checkpoint.js';
import { tempDir } from '../helpers/tmp.js';
import { rejection } from '../helpers/rejection.js';

// The flows around deep suspend on the CPU reference engine: the plugin's status gives the
// worker pid; a fake driver stands in for the process checkpoint API (no GPU here).

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

async function setUp() {
  const e = await startEngine();
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  const store = await RegionStore.open(tempDir());
  const before = (await askCapital(client, 8)).ids;
  const snap = await captureEngine(store, 'ref', client);
  const pid = (await client.wire.vsnapStatus()).ranks[0]!.pid;
  return { e, client, store, before, snap, pid };
}

describe('deep suspend through suspendEngine / restoreEngine', () => {
  it('checkpoints the worker after the sleep; a restore (as from a new SDK process) finds it by the driver state and restores it first', async () => {
    const { e, client, store, before, snap, pid } = await setUp();
    expect(pid).toBe(e.enginePid);
    const driver = new FakeCheckpointDriver([pid]);
    const r = await suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver });
    expect(Object.keys(r.phases)).toEqual(['status', ...dirtyCheckPhases(), 'sleep', 'deep.checkState', 'deep.lock', 'deep.checkpoint']);
    expect(driver.states.get(pid)).toBe('checkpointed');
    // suspending again: already asleep and deep, nothing changes
    const again = await suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver });
    expect(again.alreadyAsleep).toBe(true);
    expect(driver.states.get(pid)).toBe('checkpointed');

    // Memory made early for the weights is let go before the process gets its GPU memory back.
    const fills = (): number => readdirSync('/proc/self/fd').filter((fd) => {
      try {
        return readlinkSync(`/proc/self/fd/${fd}`).includes('memfd:vsnap-fill');
      } catch {
        return false;
      }
    }).length;
    const restoreProcess = driver.restore.bind(driver);
    let fillsAtRestore: number | undefined;
    driver.restore = async (p, pairs) => {
      fillsAtRestore = fills();
      return restoreProcess(p, pairs);
    };
    const report = await restoreEngineWith(snap, client, {}, { checkpoint: driver });
    expect(fillsAtRestore).toBe(0);
    expect(fills()).toBe(0);
    expect(Object.keys(report.phases).slice(0, 5)).toEqual(['open', 'deep.restore', 'deep.unlock', 'prepare', 'allocate']);
    expect(driver.notRunning()).toEqual([]);
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });

  it('a lock timeout leaves the engine asleep and usable: nothing locked, a plain restore works', async () => {
    const { client, store, before, snap, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    driver.fail('lock', pid, 'timeout');
    const err = await rejection(suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver }));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ reason: 'timeout', stranded: [] });
    expect(driver.notRunning()).toEqual([]);
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    await restoreEngineWith(snap, client, {}, { checkpoint: driver });
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });

  it('a failed process restore: E_CHECKPOINT saying to retry, no wake attempted; the retry restores it', async () => {
    const { client, store, before, snap, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    await suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver });
    driver.fail('restore', pid, 'driver');
    const err = await rejection(restoreEngineWith(snap, client, {}, { checkpoint: driver }));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ step: 'restore', ranks: [0] });
    expect(err.message).toMatch(/Retry the restore/);
    expect(driver.states.get(pid)).toBe('checkpointed');
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true); // no wake was attempted
    await restoreEngineWith(snap, client, {}, { checkpoint: driver });
    expect(driver.notRunning()).toEqual([]);
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });

  it('refuses deep together with tier 0', async () => {
    const { client, store } = await setUp();
    const err = await rejection(suspendEngine(store, 'ref', client, { deep: true, tiers: { gpu: {} as never } }));
    expect(err.code).toBe('E_INVALID_ARGUMENT');
  });

  it('through the real binding on a machine without the API: E_CHECKPOINT_UNSUPPORTED, and the engine is left awake', async (ctx) => {
    if ((await native().cudaStatus()).checkpointApi) ctx.skip();
    const { client, store, before } = await setUp();
    const err = await rejection(suspendEngine(store, 'ref', client, { deep: true }));
    expect(err.code).toBe('E_CHECKPOINT_UNSUPPORTED');
    const status = await client.wire.vsnapStatus();
    expect(status.sleeping).toBe(false);
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });

  it('the SwapController counts a deep-suspended engine as 0 bytes on its GPU', async () => {
    const { client, store } = await setUp();
    await suspendEngine(store, 'ref', client);
    const usage = async (deepSuspend: boolean) => {
      const c = await SwapController.create({ store, engines: [{ name: 'ref', client, memoryBytes: 10e9, asleepBytes: 2e9, deepSuspend }], budgets: { 0: 20e9 } });
      try {
        expect(c.states()[0]!.state).toBe('asleep');
        return c.usage()[0];
      } finally {
        await c.close();
      }
    };
    expect(await usage(false)).toBe(2e9);
    expect(await usage(true)).toBe(0);
  });

  it('the SwapController suspends a deepSuspend engine deep; after a failed deep step it counts its asleepBytes again', async () => {
    const { client, store, before, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    const c = await SwapController.createWith({ store, engines: [{ name: 'ref', client, memoryBytes: 10e9, asleepBytes: 2e9, deepSuspend: true }], budgets: { 0: 20e9 } }, { checkpoint: driver });
    try {
      expect(c.states()[0]!.state).toBe('awake');
      driver.fail('checkpoint', pid, 'driver');
      await expect(c.suspend('ref')).rejects.toMatchObject({ code: 'E_CHECKPOINT' });
      expect(driver.notRunning()).toEqual([]);
      expect(c.states()[0]!.state).toBe('asleep');
      expect(c.usage()[0]).toBe(2e9); // level 2 only: its context is still on the GPU
      const lease = await c.acquire('ref');
      expect((await askCapital(client, 8)).ids).toEqual(before);
      lease.release();
      await c.suspend('ref');
      expect(driver.states.get(pid)).toBe('checkpointed');
      expect(c.usage()[0]).toBe(0);
      const again = await c.acquire('ref'); // restored from deep: processes first, then the weights
      expect(driver.notRunning()).toEqual([]);
      expect((await askCapital(client, 8)).ids).toEqual(before);
      again.release();
    } finally {
      await c.close();
    }
  });
});
