import { chmodSync, closeSync, openSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { engineControl } from '../../src/engine/control.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { exportRegions, openExports } from '../../src/engine/export.js';
import { VsnapError } from '../../src/errors.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { restoreEngineWith } from '../../src/flows/restore.js';
import { suspendEngineWith } from '../../src/flows/suspend.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { FakeCheckpointDriver } from '../helpers/fake-checkpoint.js';
import { tempDir } from '../helpers/tmp.js';
import { rejection } from '../helpers/rejection.js';

// Restore onto another GPU, around the CPU reference engine: what is refused before anything
// changes, the exports deep suspend waits for, and the SwapController handing the planner's GPU
// to restoreEngine. The move itself needs two GPUs: test/gpu/remap.gpu.test.ts.

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
  return { client, store, before, snap, pid };
}

describe('restore onto another GPU: refusals and handles', () => {
  it('the SwapController: a deep engine whose processes were restored but whose wake then failed counts its asleepBytes again (it is no longer deep)', async () => {
    const { client, store, snap, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    const c = await SwapController.createWith({ store, engines: [{ name: 'ref', client, memoryBytes: 10e9, asleepBytes: 2e9, deepSuspend: true }], budgets: { 0: 20e9 }, recovery: 'fail' }, { checkpoint: driver }); // the damaged blob stays a failure (recovery: swap-recovery.test.ts)
    try {
      await c.suspend('ref');
      expect(c.usage()[0]).toBe(0);
      // a corrupted blob: the processes come back, then the hydrate refuses the chunk
      const region = snap.manifest.data.ranks[0]!.regions[0]!;
      const path = store.blobPath(region.blob);
      chmodSync(path, 0o644);
      const fd = openSync(path, 'r+');
      writeSync(fd, Buffer.from([0xff, 0xfe, 0xfd]), 0, 3, 10);
      closeSync(fd);
      await expect(c.acquire('ref')).rejects.toBeInstanceOf(VsnapError);
      expect(driver.notRunning()).toEqual([]); // restored and unlocked before the hydrate failed
      expect(c.states()[0]!.state).toBe('asleep');
      expect(c.usage()[0]).toBe(2e9);
    } finally {
      await c.close();
    }
  });

  it('the SDK closes every export of the engine before its process is checkpointed; an export left open refuses deep suspend, nothing locked', async () => {
    const { client, store, before, snap, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    const { control } = await engineControl(client);
    const open = await exportRegions(control, 1);
    expect(openExports(pid)).toBeGreaterThan(0);
    const err = await rejection(suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver }));
    expect(err.code).toBe('E_ENGINE_STATE');
    expect(err.details).toMatchObject({ reason: 'handles', ranks: [0] });
    expect(err.message).toMatch(/Close the export/);
    expect(driver.calls.filter((c) => !c.startsWith('state'))).toEqual([]); // nothing locked
    open.close();
    expect(openExports(pid)).toBe(0);
    // the engine is asleep at level 2 and deep-suspends now; the flows leave no export open
    await suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver });
    expect(driver.states.get(pid)).toBe('checkpointed');
    expect(openExports(pid)).toBe(0);
    await restoreEngineWith(snap, client, {}, { checkpoint: driver });
    expect(openExports(pid)).toBe(0);
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });

  it('onto for an engine that keeps its weights in host memory: E_INVALID_ARGUMENT before anything changes (still deep-suspended)', async () => {
    const { client, store, before, snap, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    await suspendEngineWith(store, 'ref', client, { deep: true }, { checkpoint: driver });
    driver.calls.length = 0;
    const err = await rejection(restoreEngineWith(snap, client, { move: { onto: 1 } }, { checkpoint: driver }));
    expect(err.code).toBe('E_INVALID_ARGUMENT');
    expect(err.message).toMatch(/host memory/);
    expect(driver.calls).toEqual([]);
    expect(driver.states.get(pid)).toBe('checkpointed');
    await restoreEngineWith(snap, client, {}, { checkpoint: driver });
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });

  it('the SwapController wakes a deep-suspended engine onto the GPU the planner picked; a refused move leaves it deep-suspended and its requests told why', async () => {
    const { client, store, before, pid } = await setUp();
    const driver = new FakeCheckpointDriver([pid]);
    // device 0's budget cannot hold it awake, device 1's can: it is suspended (deep) at start, and a request moves it
    const c = await SwapController.createWith({
      store,
      engines: [{ name: 'ref', client, memoryBytes: 10e9, deepSuspend: true, movableTo: [1] }],
      budgets: { 0: 5e9, 1: 20e9 },
    }, { checkpoint: driver });
    try {
      expect(driver.states.get(pid)).toBe('checkpointed');
      const failures: VsnapError[] = [];
      c.on('swapFailed', (e: { error: VsnapError }) => failures.push(e.error));
      const err = await rejection(c.acquire('ref'));
      // restoreEngine got onto: 1 (the host-memory reference engine cannot move: refused before anything changes)
      const cause = failures[0]!;
      expect(cause.code).toBe('E_INVALID_ARGUMENT');
      expect(cause.message).toMatch(/host memory: it has no GPU to move/);
      expect(err.message).toMatch(/restore of 'ref' failed/);
      expect(driver.states.get(pid)).toBe('checkpointed'); // nothing changed: still deep-suspended
      expect(c.usage()[0]).toBe(0);
    } finally {
      await c.close();
    }
    // a plain restore still brings it back
    const snap = (await store.current('ref'))!;
    expect(snap).toBeTruthy();
    expect(driver.states.get(pid)).toBe('checkpointed');
    await restoreEngineWith(Snapshot.of(store, snap), client, {}, { checkpoint: driver });
    expect((await askCapital(client, 8)).ids).toEqual(before);
  });
});
