import { chmodSync, openSync, readSync, writeSync, closeSync } from 'node:fs';

import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { VsnapError } from '../../src/errors.js';
import { captureEngine } from '../../src/flows/index.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapAgent } from '../../src/serve/agent.js';
import { SwapController, type SwapControllerOptions } from '../../src/swap/controller.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient, openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const GB = 1e9;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 20));
}

/** Two engines, room for one: `awake` serves, `asleep` was suspended (and captured) at start. */
async function pair(extra: Partial<SwapControllerOptions> = {}) {
  const engines = [];
  for (const seed of [1, 2]) {
    const engine = await startEngine({ seed, model: `m${seed}` });
    let stopping: Promise<void> | undefined;
    const e = { ...engine, stop: () => (stopping ??= engine.stop()) };
    const client = new FaultyClient({ baseUrl: e.url, token: e.token });
    cleanup.push(() => e.stop(), () => client.close());
    engines.push({ e, client, name: `m${seed}`, answer: (await askCapital(client, 8)).ids });
  }
  const store = await RegionStore.open(tempDir());
  const controller = await SwapController.create({
    store,
    engines: engines.map((x) => ({ name: x.name, client: x.client, memoryBytes: 10 * GB })),
    budgets: { 0: 15 * GB },
    recovery: 'fail', // these tests are about a damaged snapshot left damaged (swap-recovery.test.ts: recovered)
    ...extra,
  });
  cleanup.push(() => controller.close());
  const state = (n: string) => controller.states().find((s) => s.name === n)!;
  const awake = engines.find((x) => state(x.name).state === 'awake')!;
  const asleep = engines.find((x) => state(x.name).state === 'asleep')!;
  const started: string[] = [];
  const failed: VsnapError[] = [];
  controller.on('swapStarted', (e: { engine: string; action: string }) => started.push(`${e.action} ${e.engine}`));
  controller.on('swapFailed', (e: { error: VsnapError }) => failed.push(e.error));
  const ask = async (name: string) => {
    const lease = await controller.acquire(name);
    try {
      return (await askCapital(lease.client, 8)).ids;
    } finally {
      lease.release();
    }
  };
  return { engines, store, controller, state, awake, asleep, started, failed, ask };
}

/** Flips one byte in the middle of the first blob of `name`'s current capture. */
async function corrupt(store: RegionStore, name: string): Promise<() => void> {
  const region = [...(await Snapshot.open(store, name)).manifest.regions()][0]!.region;
  const path = store.blobPath(region.blob);
  chmodSync(path, 0o644);
  const fd = openSync(path, 'r+');
  const at = Math.floor(region.size / 2);
  const byte = Buffer.alloc(1);
  readSync(fd, byte, 0, 1, at);
  const original = byte[0]!;
  writeSync(fd, Buffer.from([original ^ 0xff]), 0, 1, at);
  closeSync(fd);
  return () => {
    const w = openSync(path, 'r+');
    writeSync(w, Buffer.from([original]), 0, 1, at);
    closeSync(w);
  };
}

describe('swaps fail without collateral damage', () => {
  it('a damaged snapshot evicts a healthy engine at most once, then never again; clients get a short error; verify clears it', async () => {
    const { store, controller, state, awake, asleep, started, failed, ask } = await pair();
    const repair = await corrupt(store, asleep.name);
    const first = await controller.acquire(asleep.name).catch((e: unknown) => e as VsnapError);
    expect(first).toBeInstanceOf(VsnapError);
    expect((first as VsnapError).code).toBe('E_NOT_RESTORABLE');
    expect((first as VsnapError).message).not.toMatch(/\//); // no file paths for clients
    expect(failed.at(-1)!.code).toBe('E_CHECKSUM'); // the operator's detail
    expect(state(asleep.name)).toMatchObject({ state: 'asleep', snapshotProblem: expect.stringMatching(/E_CHECKSUM/) });
    expect(await controller.snapshotStatus(asleep.name)).toMatchObject({ restorable: false, problems: [expect.stringMatching(/E_CHECKSUM/)] });
    const agent = await SwapAgent.listen({ controller, store, controlToken: 'ctl' });
    cleanup.push(() => agent.close());
    const status = await request(`${agent.url}/engines/${asleep.name}/snapshot_status`, { headers: { authorization: 'Bearer ctl' } });
    expect(await status.body.json()).toMatchObject({ restorable: false, cached: true, reason: expect.stringMatching(/E_CHECKSUM/) });
    // the healthy engine comes back, and stays: further requests for the damaged one evict nobody
    expect(await ask(awake.name)).toEqual(awake.answer);
    started.length = 0;
    for (let i = 0; i < 3; i++) expect(((await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError).code).toBe('E_NOT_RESTORABLE');
    expect(started).toEqual([]);
    expect(state(awake.name).state).toBe('awake');
    // recovery: a verify that fails keeps the mark; once the blob is repaired, a verify clears it
    expect((await controller.verifySnapshot(asleep.name)).ok).toBe(false);
    repair();
    expect((await controller.verifySnapshot(asleep.name)).ok).toBe(true);
    expect(state(asleep.name).snapshotProblem).toBeUndefined();
    expect(await ask(asleep.name)).toEqual(asleep.answer);
  });

  it('a new capture clears the damage mark', async () => {
    const { store, controller, state, asleep, ask } = await pair();
    await corrupt(store, asleep.name);
    expect(((await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError).code).toBe('E_NOT_RESTORABLE');
    // The operator brings the engine up again (a real one is restarted and loads its checkpoint; the
    // reference engine is just woken, holding whatever its memory now has) and captures it anew.
    await asleep.client.wire.vsnapWake();
    await controller.resync(asleep.name);
    expect(state(asleep.name).state).toBe('awake');
    await captureEngine(store, asleep.name, asleep.client);
    const captured = (await askCapital(asleep.client, 8)).ids;
    expect((await controller.snapshotStatus(asleep.name)).restorable).toBe(true);
    await controller.suspend(asleep.name);
    expect(await ask(asleep.name)).toEqual(captured); // restored from the new capture, not refused
    expect(state(asleep.name).snapshotProblem).toBeUndefined();
  });

  it('with a RAM tier, a damaged snapshot is found before anyone is suspended for it', async () => {
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    cleanup.push(() => cache.close());
    const { store, controller, state, awake, asleep, started } = await pair({ tiers: { ram: cache } });
    cache.clear(); // the RAM copy made at capture is good: drop it, so the (damaged) store copy is loaded
    await corrupt(store, asleep.name);
    started.length = 0;
    const err = (await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError;
    expect(err.code).toBe('E_NOT_RESTORABLE');
    expect(started).toEqual([]);
    expect(state(awake.name).state).toBe('awake');
  });

  it('a request during a manual suspend waits for it instead of a false E_BUSY', async () => {
    const { controller, state, awake, asleep, ask } = await pair();
    // the engine's sleep is held until the request is seen waiting (was: held 1 s, the request sent 100 ms in)
    let underWay!: () => void;
    let release!: () => void;
    const sleeping = new Promise<void>((r) => (underWay = r));
    const held = new Promise<void>((r) => (release = r));
    awake.client.inject({ route: 'sleep', pass: true, action: () => (underWay(), held) });
    const suspending = controller.suspend(awake.name, { captureIfNeeded: true });
    await sleeping; // the suspend is under way
    let settled = false;
    const answer = ask(asleep.name).finally(() => (settled = true));
    await until(() => state(asleep.name).waiting > 0 || settled); // the test's timeout bounds this
    release();
    await suspending;
    expect(await answer).toEqual(asleep.answer);
  });

  it('a suspend whose answer was lost: the engine is read back asleep, no lease goes to it, the next request restores it', async () => {
    const { controller, state, awake, asleep, ask } = await pair();
    awake.client.inject({ route: 'sleep', when: 'after' }); // it did sleep; the answer never came
    await expect(controller.suspend(awake.name, { captureIfNeeded: true })).rejects.toThrow(/injected fault/);
    expect(state(awake.name).state).toBe('asleep');
    expect(await ask(asleep.name)).toEqual(asleep.answer);
    expect(await ask(awake.name)).toEqual(awake.answer); // restored before any request reached it
  });

  it('a wake that fails at the engine: waiters get a short error, the snapshot is not marked, the next request works', async () => {
    const { controller, state, asleep, ask, failed } = await pair();
    asleep.client.inject({ route: 'adopt', when: 'before' }); // the wake of the weights, handed the memory being filled
    const err = (await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError;
    expect(err.code).toBe('E_ENGINE_HTTP');
    expect(err.message).not.toMatch(/http:|\//);
    expect(failed.at(-1)!.message).toMatch(/injected fault/);
    expect(state(asleep.name)).toMatchObject({ state: 'asleep' });
    expect(state(asleep.name).snapshotProblem).toBeUndefined();
    expect(await ask(asleep.name)).toEqual(asleep.answer);
  });

  it('an engine that dies mid-restore is marked failed and never leased; the other engine still serves; nothing leaks', async () => {
    const { controller, state, awake, asleep, ask } = await pair();
    expect(await ask(asleep.name)).toEqual(asleep.answer); // one full swap, so pools are in the baseline
    expect(await ask(awake.name)).toEqual(awake.answer);
    const fds = openFds();
    // it dies as its weights' wake starts: the memory made for it is being filled (and must not leak)
    asleep.client.inject({ route: 'adopt', when: 'before', action: () => asleep.e.stop() });
    const err = (await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(state(asleep.name).state).toBe('failed');
    expect(((await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError).code).toBe('E_ENGINE_UNREACHABLE');
    expect(await ask(awake.name)).toEqual(awake.answer);
    expect(openFds()).toEqual(fds);
  });

  it('a suspend that fails to make room answers the request at once, and is not retried in a loop', async () => {
    const { controller, awake, asleep, state } = await pair();
    awake.client.inject({ route: 'sleep', times: 100 });
    awake.client.calls.length = 0;
    const err = (await controller.acquire(asleep.name).catch((e: unknown) => e)) as VsnapError;
    expect(err.message).toMatch(/could not be given room/);
    await new Promise((r) => setTimeout(r, 2500)); // two ticks of the background timer
    expect(awake.client.calls.filter((c) => c === 'sleep')).toHaveLength(1);
    expect(state(awake.name).state).toBe('awake');
  });

  it('a default model whose wake keeps failing is tried once, then left alone for a while (no hot loop)', async () => {
    const { controller, engines, awake } = await pair({ defaultModel: 'm1' });
    const m1 = engines.find((x) => x.name === 'm1')!;
    for (const x of engines) x.client.inject({ route: 'wake', times: 100 });
    await controller.suspend(awake.name, { captureIfNeeded: true }); // nothing awake: the default model is wanted
    m1.client.calls.length = 0;
    await new Promise((r) => setTimeout(r, 2500));
    expect(m1.client.calls.filter((c) => c === 'wake').length).toBeLessThanOrEqual(1);
  });

  it('an engine that dies while being suspended is read back as failed, not assumed awake', async () => {
    const { controller, state, awake } = await pair();
    awake.client.inject({ route: 'sleep', when: 'before', action: () => awake.e.stop() });
    await expect(controller.suspend(awake.name, { captureIfNeeded: true })).rejects.toBeInstanceOf(VsnapError);
    expect(state(awake.name).state).toBe('failed');
  });
});
