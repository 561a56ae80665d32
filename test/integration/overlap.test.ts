import { chmodSync, closeSync, openSync, readFileSync, writeFileSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { GpuTier } from '../../src/cache/gpu-tier.js';
import { VsnapError } from '../../src/errors.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { swapEngines, type SwapOverlap } from '../../src/flows/swap.js';
import { native } from '../../src/native/index.js';
import type { TransferProgress } from '../../src/transfer/transfer.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient, openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function engine(seed: number) {
  const e = await startEngine({ seed });
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  cleanup.push(() => e.stop(), () => client.close());
  return client;
}

const ask = async (client: FaultyClient) => (await askCapital(client, 8)).ids;
const warn = { onWarning: () => undefined };
const delay = (ms: number) => () => new Promise((r) => setTimeout(r, ms));

describe('restoreEngine with overlapKvWake: the KV cache wakes while the hydrate runs', () => {
  it('restores the same answer; wakeKvCache is reported as overlapped, the report stays as it was otherwise', async () => {
    const client = await engine(1);
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
    const report = await restoreEngine(snapshot, client, { overlapKvWake: true });
    // The weights' wake (adopting the memory filled here) and, once it is done, the KV cache's: both beside the hydrate.
    expect(report.overlapped).toEqual(['describe', 'validate', 'allocateRest', 'wakeWeights', 'wakeKvCache']);
    expect(Object.keys(report.phases)).toEqual(['prepare', 'allocate', 'hydrate', 'verifyDigests', 'wakeWeightsWait', 'describe', 'validate', 'allocateRest', 'wakeWeights', 'wakeKvCache', 'wakeKvCacheWait', 'resetPrefixCache', 'expectedResponse']);
    expect(await ask(client)).toEqual(before);
    // without the option: serial, as before, and no `overlapped`
    await suspendEngine(store, 'ref', client);
    const serial = await restoreEngine(snapshot, client);
    expect(serial.overlapped).toEqual(['describe', 'validate', 'allocateRest', 'wakeWeights']);
    expect(Object.keys(serial.phases)).not.toContain('wakeKvCacheWait');
    expect(await ask(client)).toEqual(before);
  });

  it("the reference engine resumes scheduling as soon as its KV cache wakes beside awake weights, as vLLM's EngineCore.wake_up does", async () => {
    // Why overlapKvWake is opt-in: no wake of the KV cache leaves scheduling paused.
    const client = await engine(1);
    const store = await RegionStore.open(tempDir());
    await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
    await client.wire.vsnapWake({ tags: ['weights'] });
    expect(await client.wire.isSleeping()).toBe(true);
    await client.wire.vsnapWake({ tags: ['kv_cache'] }); // without `scheduling`: resumed all the same
    expect(await client.wire.isSleeping()).toBe(false);
  });

  it('the hydrate fails while the KV wake is in flight: the wake is waited for, the engine goes back to sleep, nothing leaks', async () => {
    const client = await engine(1);
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    await suspendEngine(store, 'ref', client);
    await restoreEngine(snap, client);
    const fds = openFds();
    await suspendEngine(store, 'ref', client);
    const region = snap.manifest.data.ranks[0]!.regions.find((r) => r.key === 'model.embed_tokens.weight')!;
    const path = store.blobPath(region.blob);
    chmodSync(path, 0o644);
    const fd = openSync(path, 'r+');
    writeSync(fd, Buffer.from([0xff, 0xfe]), 0, 2, 1000);
    closeSync(fd);
    // still in flight when the hydrate fails: its answer is held back
    const order: string[] = [];
    client.inject({ route: 'wakeKv', when: 'after', pass: true, action: async () => (await delay(400)(), order.push('KV wake answered')) });
    client.inject({ route: 'sleep', pass: true, action: () => order.push('sleep') });
    const err = (await restoreEngine(snap, client, { overlapKvWake: true, ...warn }).catch((x: unknown) => x)) as VsnapError;
    expect(err.code).toBe('E_CHECKSUM');
    expect(err.details.recovered).toBe(true);
    expect(order).toEqual(['KV wake answered', 'sleep']); // the wake was waited for, then the sleep
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    expect(openFds()).toEqual(fds);
  });

  for (const when of ['before', 'after'] as const) {
    it(`the KV wake fails (${when}) while the hydrate runs: the engine goes back to sleep, nothing leaks, the next restore works`, async () => {
      const client = await engine(1);
      const store = await RegionStore.open(tempDir());
      const before = await ask(client);
      const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
      await restoreEngine(snapshot, client);
      const fds = openFds();
      await suspendEngine(store, 'ref', client);
      client.inject({ route: 'wakeKv', when });
      const err = (await restoreEngine(snapshot, client, { overlapKvWake: true, ...warn }).catch((x: unknown) => x)) as VsnapError;
      expect(err).toBeInstanceOf(VsnapError);
      expect(err.message).toMatch(/injected fault: wakeKv/);
      expect(err.details.recovered).toBe(true);
      expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
      expect(openFds()).toEqual(fds);
      await restoreEngine(snapshot, client, { overlapKvWake: true });
      expect(await ask(client)).toEqual(before);
    });
  }
});

/** Engine A awake (its snapshot captured), engine B asleep (its snapshot captured): a swap puts A to sleep and brings B back. */
async function pair() {
  const a = await engine(1);
  const b = await engine(2);
  const store = await RegionStore.open(tempDir());
  const answerA = await ask(a);
  const answerB = await ask(b);
  expect(answerA).not.toEqual(answerB);
  await captureEngine(store, 'a', a);
  const { snapshot: snapB } = await suspendEngine(store, 'b', b, { captureIfNeeded: true });
  const fds = openFds();
  return { a, b, store, answerA, answerB, snapB, fds };
}

describe('swapEngines: one engine to sleep, the other back, overlapped', () => {
  for (const overlap of ['none', 'weights', 'all'] as SwapOverlap[]) {
    it(`overlap ${overlap}: both answers right after swaps both ways, both sub-reports and the phases`, async () => {
      const { a, b, store, answerA, answerB, snapB, fds } = await pair();
      const order: string[] = [];
      a.inject({ route: 'sleep', when: 'after', pass: true, action: () => order.push('a slept') });
      b.inject({ route: 'wakeKv', when: 'before', pass: true, action: () => order.push('b wakes its KV cache') });
      const report = await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, overlapKvWake: overlap !== 'none' }, overlap });
      expect(report.overlap).toBe(overlap);
      expect(report.suspend.alreadyAsleep).toBe(false);
      expect(report.restore.path).toBe('restored');
      expect(Object.keys(report.phases)).toEqual(expect.arrayContaining(['suspend', 'restore']));
      if (overlap !== 'all') expect(order).toEqual(['a slept', 'b wakes its KV cache']);
      if (overlap === 'weights') expect(report.restore.overlapped).toEqual(['describe', 'validate', 'allocateRest', 'wakeWeights', 'awaitRoom', 'wakeKvCache']);
      expect(await a.wire.isSleeping()).toBe(true);
      expect(await ask(b)).toEqual(answerB);
      // and back
      const back = await swapEngines({ suspend: { client: b, name: 'b', store }, restore: { source: { store, name: 'a' }, client: a }, overlap });
      expect(back.restore.tier).toBe('store');
      expect(await b.wire.isSleeping()).toBe(true);
      expect(await ask(a)).toEqual(answerA);
      expect(openFds()).toEqual(fds);
    });
  }

  for (const overlap of ['weights', 'all'] as SwapOverlap[]) {
    it(`${overlap}: the suspended engine sleeps only once the restore's copy is over (memory freed beside a copy slows it); a restore that fails first lets it sleep`, async () => {
      const { a, b, answerB, snapB, fds } = await pair();
      const order: string[] = [];
      a.inject({ route: 'sleep', when: 'before', pass: true, action: () => order.push('a sleeps'), times: 2 });
      // the restore's copy (from the RAM tier: 'done' once its last byte landed) is over before the swap lets the other engine sleep
      const onProgress = (p: TransferProgress): void => void (p.phase === 'done' && order.push('b copied'));
      const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
      cleanup.push(() => cache.close());
      await cache.load(snapB.store, snapB.manifest);
      native().setFault('chunk-delay', 2, 200); // b's copy outlasts a's checks
      let report;
      try {
        report = await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, overlapKvWake: true, tiers: { ram: cache }, transfer: { onProgress } }, overlap });
      } finally {
        native().setFault('chunk-delay', 0);
      }
      expect(order).toEqual(['b copied', 'a sleeps']);
      expect(typeof report.suspend.phases.awaitCopy).toBe('number');
      expect(await a.wire.isSleeping()).toBe(true);
      expect(await ask(b)).toEqual(answerB);
      expect(openFds()).toEqual(fds);
      // the restore fails before any copy (its status read): the other engine still sleeps, once
      await restoreEngine({ store: snapB.store, name: 'a' }, a);
      await suspendEngine(snapB.store, 'b', b);
      order.length = 0;
      b.inject({ route: 'status' });
      const err = (await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, ...warn }, overlap }).catch((x: unknown) => x)) as VsnapError;
      expect(err.details).toMatchObject({ suspended: 'asleep' });
      expect(order).toEqual(['a sleeps']);
      expect(openFds()).toEqual(fds);
    });
  }

  it("weights: the restore's copy fails (a damaged blob): the suspended engine still sleeps (it waited for the copy to be over, not to land), the restored one is back asleep, nothing leaks", async () => {
    const { a, b, answerB, snapB, fds } = await pair();
    const region = snapB.manifest.data.ranks[0]!.regions.find((r) => r.key === 'model.embed_tokens.weight')!;
    const path = snapB.store.blobPath(region.blob);
    const original = readFileSync(path);
    chmodSync(path, 0o644);
    const fd = openSync(path, 'r+');
    writeSync(fd, Buffer.from([0xff, 0xfe]), 0, 2, 1000);
    closeSync(fd);
    const order: string[] = [];
    a.inject({ route: 'sleep', when: 'before', pass: true, action: () => order.push('a sleeps') });
    const err = (await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, overlapKvWake: true, ...warn }, overlap: 'weights' }).catch((x: unknown) => x)) as VsnapError;
    expect((err.details.restoreError as VsnapError).code).toBe('E_CHECKSUM');
    expect(err.details).toMatchObject({ suspended: 'asleep', restored: 'asleep' });
    expect((err.details.suspendResult as { phases: Record<string, number> }).phases).toHaveProperty('awaitCopy');
    expect(order).toEqual(['a sleeps']);
    expect(openFds()).toEqual(fds);
    writeFileSync(path, original); // repaired: the next restore works
    await restoreEngine(snapB, b);
    expect(await ask(b)).toEqual(answerB);
  });

  for (const kvOverlap of [false, true]) {
    it(`weights: the suspend fails, so the restored engine goes back to sleep before its KV cache wakes; the error says both states${kvOverlap ? ' (KV wake overlapped)' : ''}`, async () => {
      const { a, b, store, answerA, answerB, snapB, fds } = await pair();
      a.inject({ route: 'sleep' });
      b.calls.length = 0;
      const err = (await swapEngines({ suspend: { client: a, name: 'a', store }, restore: { source: snapB, client: b, overlapKvWake: kvOverlap, ...warn }, overlap: 'weights' }).catch((x: unknown) => x)) as VsnapError;
      expect(err).toBeInstanceOf(VsnapError);
      expect(err.details).toMatchObject({ suspended: 'awake', restored: 'asleep' });
      expect(err.details.restoreError).toBeInstanceOf(VsnapError);
      expect(err.message).toMatch(/is awake; the restored one .* is asleep/);
      expect(b.calls).not.toContain('wakeKv');
      expect(await ask(a)).toEqual(answerA);
      expect(await b.wire.isSleeping()).toBe(true);
      expect(openFds()).toEqual(fds);
      const again = await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b }, overlap: 'weights' });
      expect(again.restore.path).toBe('restored');
      expect(await ask(b)).toEqual(answerB);
    });
  }

  it('weights, the restored engine in tier 0: the suspend fails, so the adopted weights go back to sleep (no fallback to the snapshot); a retry restores', async () => {
    const { a, b, answerB, snapB, fds } = await pair();
    const resident = new GpuTier();
    cleanup.push(() => resident.close());
    await restoreEngine(snapB, b);
    await suspendEngine(snapB.store, 'b', b, { tiers: { gpu: resident } });
    expect(resident.entries()).toHaveLength(1);
    a.inject({ route: 'sleep' });
    b.calls.length = 0;
    const err = (await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, ...warn, tiers: { gpu: resident } }, overlap: 'weights' }).catch((x: unknown) => x)) as VsnapError;
    expect(err.details).toMatchObject({ suspended: 'awake', restored: 'asleep' });
    expect((err.details.restoreError as VsnapError).code).toBe('E_ABORTED');
    expect(b.calls).toContain('adopt');
    expect(b.calls).not.toContain('wake'); // no fallback to the snapshot
    expect(b.calls).not.toContain('wakeKv');
    expect(resident.entries()).toEqual([]);
    expect(openFds()).toEqual(fds);
    await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b }, overlap: 'weights' });
    expect(await ask(b)).toEqual(answerB);
  });

  it('all: the suspend fails, the restore still completes (both fit); the error carries its report and says both states', async () => {
    const { a, b, answerA, answerB, snapB, fds } = await pair();
    a.inject({ route: 'sleep' });
    const err = (await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, ...warn }, overlap: 'all' }).catch((x: unknown) => x)) as VsnapError;
    expect(err.details).toMatchObject({ suspended: 'awake', restored: 'awake' });
    expect(err.details.restoreReport).toMatchObject({ path: 'restored' });
    expect(await ask(a)).toEqual(answerA);
    expect(await ask(b)).toEqual(answerB);
    expect(openFds()).toEqual(fds);
  });

  it('all: the restore fails, the suspend still completes (that engine asleep), nothing leaks; a retry restores', async () => {
    const { a, b, answerB, snapB, fds } = await pair();
    b.inject({ route: 'complete' });
    const err = (await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, ...warn }, overlap: 'all' }).catch((x: unknown) => x)) as VsnapError;
    expect(err.details).toMatchObject({ suspended: 'asleep' });
    expect(err.details.suspendResult).toBeDefined();
    expect(openFds()).toEqual(fds);
    await restoreEngine(snapB, b);
    expect(await ask(b)).toEqual(answerB);
  });

  it('weights: the restore fails, the suspend still completes (that engine asleep, its snapshot whole); a retry restores', async () => {
    const { a, b, answerA, answerB, snapB, fds } = await pair();
    b.inject({ route: 'complete' }); // the expected-response check
    const err = (await swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: b, ...warn }, overlap: 'weights' }).catch((x: unknown) => x)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(err.details).toMatchObject({ suspended: 'asleep', restored: 'asleep' });
    expect(err.details.suspendResult).toBeDefined();
    expect(err.message).toMatch(/the restore failed .* the suspend of 'a' completed/s);
    expect(openFds()).toEqual(fds);
    await restoreEngine(snapB, b);
    expect(await ask(b)).toEqual(answerB);
    const { store } = { store: snapB.store };
    await suspendEngine(store, 'b', b);
    await restoreEngine({ store, name: 'a' }, a);
    expect(await ask(a)).toEqual(answerA);
  });

  it('refuses a bad overlap and the same engine on both sides', async () => {
    const { a, snapB } = await pair();
    await expect(swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: a }, overlap: 'weights' })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(swapEngines({ suspend: { client: a, name: 'a' }, restore: { source: snapB, client: a }, overlap: 'most' as SwapOverlap })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});
