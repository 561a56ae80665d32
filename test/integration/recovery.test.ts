import { chmodSync, closeSync, openSync, readSync, rmSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import type { EngineClient } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import type { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine, type EngineOptions } from '../helpers/engine.js';
import { FaultyClient, openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// Recovery through the engine's own loader (restoreEngine's recovery: 'reload'): the reference
// engine's reload_weights rebuilds its weights from its model source (its seed), and counts every
// load (ref_weight_loads), so a recovery is told from a restore without timing.

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});
const quiet = { onWarning: () => undefined };

async function engineWith(options: EngineOptions = {}) {
  const engine = await startEngine(options);
  let stopping: Promise<void> | undefined;
  const e = { ...engine, stop: () => (stopping ??= engine.stop()) };
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  cleanup.push(() => e.stop(), () => client.close());
  return { e, client };
}

/** An engine asleep with its snapshot 'ref' in a fresh store, and its answer from before. */
async function setup(options: EngineOptions = {}) {
  const { e, client } = await engineWith(options);
  const store = await RegionStore.open(tempDir());
  const answer = (await askCapital(client, 8)).ids;
  const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
  const ask = async () => (await askCapital(client, 8)).ids;
  return { e, client, store, answer, ask, snapshot };
}

async function loads(client: EngineClient): Promise<number> {
  return Number((await client.wire.collectiveRpc('ref_weight_loads'))![0]);
}
const sleeping = async (client: FaultyClient) => (await client.wire.vsnapStatus()).sleeping;

function firstBlob(snapshot: Snapshot): string {
  const [first] = [...snapshot.manifest.regions()];
  return snapshot.store.blobPath(first!.region.blob);
}

function flipByte(path: string, at = 4096): void {
  chmodSync(path, 0o644);
  const fd = openSync(path, 'r+');
  const b = Buffer.alloc(1);
  readSync(fd, b, 0, 1, at);
  b[0]! ^= 0xff;
  writeSync(fd, b, 0, 1, at);
  closeSync(fd);
}

describe('recovery: each cause, fail (today) then reload', () => {
  it('snapshot missing: fail refuses before touching the engine; reload serves the same answer (materialize off: nothing captured)', async () => {
    const { client, store, answer, ask } = await setup();
    await store.remove('ref');
    const before = await loads(client);
    client.calls.length = 0;
    const err = (await restoreEngine({ store, name: 'ref' }, client).catch((x: unknown) => x)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(err.code).toBe('E_SNAPSHOT_NOT_FOUND');
    expect(client.calls).toEqual([]);
    expect(await sleeping(client)).toBe(true);

    const report = await restoreEngine({ store, name: 'ref' }, client, { recovery: 'reload', ...quiet });
    expect(report).toMatchObject({ path: 'recovered', tier: 'engine', recovery: { reason: 'missing', code: 'E_SNAPSHOT_NOT_FOUND', expectedResponse: 'unchecked', materialize: 'off' } });
    expect(report.recovery!.uncheckedReason).toMatch(/manifest could not be read/);
    expect(report.phases.reloadWeights).toBeGreaterThanOrEqual(0);
    expect(report.route).toBe('reloaded');
    expect(await loads(client)).toBe(before + 1);
    expect(await ask()).toEqual(answer);
    expect(await store.current('ref')).toBeUndefined();
  });

  it('blob corrupted: fail gives E_CHECKSUM with the engine asleep; reload (materialize required) checks the answer and publishes a verified snapshot before returning', async () => {
    const { client, store, answer, ask, snapshot } = await setup();
    flipByte(firstBlob(snapshot));
    const before = await loads(client);
    const err = (await restoreEngine(snapshot, client, quiet).catch((x: unknown) => x)) as VsnapError;
    expect(err.code).toBe('E_CHECKSUM');
    expect(err.details.recovered).toBe(true);
    expect(await sleeping(client)).toBe(true);
    expect(await loads(client)).toBe(before);

    const report = await restoreEngine(snapshot, client, { ...quiet, recovery: { policy: 'reload', materialize: 'required' } });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'damaged', code: 'E_CHECKSUM', expectedResponse: 'matched', materialize: 'required' } });
    const fresh = report.recovery!.snapshot!;
    expect(fresh.id).not.toBe(snapshot.id);
    expect((await store.current('ref'))!.id).toBe(fresh.id);
    expect((await fresh.verify()).ok).toBe(true);
    expect(await ask()).toEqual(answer);
    expect(await loads(client)).toBe(before + 1);
    // The new snapshot restores like any other: no reload this time.
    const suspended = await suspendEngine(store, 'ref', client);
    expect(suspended.captured).toBe(false);
    expect((await restoreEngine(suspended.snapshot, client, { recovery: 'reload' })).path).toBe('restored');
    expect(await loads(client)).toBe(before + 1);
    expect(await ask()).toEqual(answer);
  });

  it('blob deleted: reload with materialize async serves at once and publishes a new snapshot in the background', async () => {
    const { client, store, answer, ask, snapshot } = await setup();
    rmSync(firstBlob(snapshot));
    expect(((await restoreEngine(snapshot, client, quiet).catch((x: unknown) => x)) as VsnapError).code).toBe('E_BLOB_MISSING');
    const report = await restoreEngine(snapshot, client, { ...quiet, recovery: { policy: 'reload', materialize: 'async' } });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'missing', code: 'E_BLOB_MISSING', expectedResponse: 'matched', materialize: 'async' } });
    expect(report.recovery!.snapshot).toBeUndefined();
    expect(await ask()).toEqual(answer); // serving while the capture runs
    const outcome = await report.recovery!.materialized!;
    expect(outcome.ok).toBe(true);
    const fresh = (outcome as { snapshot: Snapshot }).snapshot;
    expect((await store.current('ref'))!.id).toBe(fresh.id);
    expect((await fresh.verify()).ok).toBe(true);
    const suspended = await suspendEngine(store, 'ref', client);
    expect(suspended.captured).toBe(false);
    expect((await restoreEngine(suspended.snapshot, client)).path).toBe('restored');
    expect(await ask()).toEqual(answer);
  });

  it('async materialize that fails is reported, not thrown; the engine keeps serving', async () => {
    const { client, store, answer, ask } = await setup();
    await store.remove('ref');
    const warnings: string[] = [];
    client.inject({ route: 'export' }); // the restore's recovery exports nothing: this is the capture's export
    const report = await restoreEngine({ store, name: 'ref' }, client, { onWarning: (m) => warnings.push(m), recovery: { policy: 'reload', materialize: 'async' } });
    const outcome = await report.recovery!.materialized!;
    expect(outcome.ok).toBe(false);
    expect((outcome as { error: VsnapError }).error.code).toBe('E_ENGINE_HTTP');
    expect(warnings.join('\n')).toMatch(/capturing a new snapshot failed/);
    expect(await store.current('ref')).toBeUndefined();
    expect(await ask()).toEqual(answer);
  });

  it('RAM copy lost (persist off, evicted): fail gives E_NOT_DURABLE; reload recovers and checks the answer', async () => {
    const { client, store, answer, ask, snapshot } = await setup();
    await restoreEngine(snapshot, client);
    await store.remove('ref');
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    cleanup.push(() => cache.close());
    const { snapshot: ramOnly } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, capture: { ram: cache, persist: 'off' } });
    expect(ramOnly.durable).toBe(false);
    expect(cache.evict(ramOnly.id)).toBe(true);
    const err = (await restoreEngine(ramOnly, client, { ...quiet, tiers: { ram: cache } }).catch((x: unknown) => x)) as VsnapError;
    expect(err.code).toBe('E_NOT_DURABLE');
    expect(await sleeping(client)).toBe(true);
    const report = await restoreEngine(ramOnly, client, { ...quiet, recovery: 'reload', tiers: { ram: cache } });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'not-durable', code: 'E_NOT_DURABLE', expectedResponse: 'matched' } });
    expect(await ask()).toEqual(answer);
    expect(cache.usedBytes).toBe(0);
  });

  it("without the vsnap routes (vLLM's dev routes only): the reload goes through /collective_rpc", async () => {
    const { client, store, answer, ask } = await setup({ env: { VSNAP_REF_NO_BUILD_APP: '1' } });
    expect((await client.wire.routeMechanism()).mechanism).toBeNull();
    await store.remove('ref');
    const before = await loads(client);
    const report = await restoreEngine({ store, name: 'ref' }, client, { recovery: 'reload', ...quiet });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'missing' } });
    expect(await loads(client)).toBe(before + 1);
    expect(await ask()).toEqual(answer);
  });

  it('incompatible (taken by another engine version): reload recovers; a snapshot of another model is never recovered past', async () => {
    const { client, store, answer, ask } = await setup();
    // The same model under an upgraded engine: its snapshot no longer matches this one.
    const upgraded = await engineWith({ env: { VSNAP_REF_VERSION: '9.9.9' } });
    const newer = await suspendEngine(store, 'newer', upgraded.client, { captureIfNeeded: true });
    // Another model (seed 2) with the same layout.
    const other = await engineWith({ seed: 2 });
    const another = await suspendEngine(store, 'other', other.client, { captureIfNeeded: true });
    await upgraded.e.stop();
    await other.e.stop();
    const before = await loads(client);

    const err = (await restoreEngine(newer.snapshot, client, quiet).catch((x: unknown) => x)) as VsnapError;
    expect(err.code).toBe('E_MANIFEST_MISMATCH');
    expect(err.message).toMatch(/engine\.version/);
    const report = await restoreEngine(newer.snapshot, client, { recovery: 'reload', ...quiet });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'incompatible', code: 'E_MANIFEST_MISMATCH', expectedResponse: 'matched' } });
    expect(await ask()).toEqual(answer);
    expect(await loads(client)).toBe(before + 1);

    await suspendEngine(store, 'ref', client);
    // Wrong model: refused, not reloaded (the engine would load its own model, not the one asked for).
    const wrong = (await restoreEngine(another.snapshot, client, { recovery: 'reload', ...quiet }).catch((x: unknown) => x)) as VsnapError;
    expect(wrong.code).toBe('E_MANIFEST_MISMATCH');
    expect(wrong.message).toMatch(/model\.id/);
    flipByte(firstBlob(another.snapshot));
    const swap = (await restoreEngine(another.snapshot, client, { recovery: 'reload', allowModelSwap: true, ...quiet }).catch((x: unknown) => x)) as VsnapError;
    expect(swap.code).toBe('E_CHECKSUM');
    expect(await loads(client)).toBe(before + 1);
    expect(await sleeping(client)).toBe(true);
  });
});

describe('a fault during the reload: the engine is left asleep (or said dead), nothing leaks', () => {
  it("the engine's reload fails half way: asleep, a clear error naming both failures, no fds or RAM tier left", async () => {
    const { client, store, snapshot } = await setup({ env: { VSNAP_REF_RELOAD_FAIL: '1' } });
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    cleanup.push(() => cache.close());
    flipByte(firstBlob(snapshot));
    const fds = openFds();
    const before = await loads(client);
    const err = (await restoreEngine(snapshot, client, { ...quiet, recovery: { policy: 'reload', materialize: 'required' }, tiers: { ram: cache } }).catch((x: unknown) => x)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(err.code).toBe('E_ENGINE_HTTP');
    expect(err.details).toMatchObject({ recovered: true, recovery: 'damaged', snapshotError: 'E_CHECKSUM' });
    expect(err.message).toMatch(/could not be used \(E_CHECKSUM\).*reload of its weights/s);
    expect(err.message).toMatch(/VSNAP_REF_RELOAD_FAIL/);
    expect(await sleeping(client)).toBe(true);
    expect((await client.wire.vsnapStatus()).ranks.every((r) => !r.weightsMapped)).toBe(true);
    expect(await loads(client)).toBe(before);
    expect(openFds()).toEqual(fds);
    expect(cache.usedBytes).toBe(0);
    expect(cache.entries).toEqual([]);
    expect((await store.current('ref'))!.id).toBe(snapshot.id); // nothing was captured
  });

  // A fault at each step of the recovery (the engine answers an error): asleep, nothing leaks, the next try works.
  for (const route of ['wake', 'reload', 'wakeKv', 'reset', 'complete'] as const) {
    it(`${route} fails during a recovery`, async () => {
      const { client, store, answer, ask, snapshot } = await setup();
      // 'complete' is the expected-response check: it needs a readable manifest (a blob lost, not the snapshot)
      const source = route === 'complete' ? snapshot : { store, name: 'ref' };
      if (route === 'complete') rmSync(firstBlob(snapshot));
      else await store.remove('ref');
      const fds = openFds();
      client.inject({ route });
      const err = (await restoreEngine(source, client, { recovery: 'reload', ...quiet }).catch((x: unknown) => x)) as VsnapError;
      expect(err).toBeInstanceOf(VsnapError);
      expect(err.details).toMatchObject({ recovered: true, snapshotError: route === 'complete' ? 'E_BLOB_MISSING' : 'E_SNAPSHOT_NOT_FOUND' });
      expect(err.message).toMatch(/injected fault/);
      expect(await sleeping(client)).toBe(true);
      expect(openFds()).toEqual(fds);
      expect((await restoreEngine(source, client, { recovery: 'reload', ...quiet })).path).toBe('recovered');
      expect(await ask()).toEqual(answer);
    });
  }

  it('the engine dies during the reload: the error says so (not asleep: restart it), no fds left', async () => {
    const { e, client, store } = await setup();
    await store.remove('ref');
    const fds = openFds();
    client.inject({ route: 'reload', pass: true, action: () => process.kill(e.enginePid, 'SIGKILL') });
    const err = (await restoreEngine({ store, name: 'ref' }, client, { recovery: 'reload', ...quiet }).catch((x: unknown) => x)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(err.details).toMatchObject({ recovered: false, recovery: 'missing', snapshotError: 'E_SNAPSHOT_NOT_FOUND' });
    expect(err.message).toMatch(/no longer answers.*restart it/s);
    expect(openFds()).toEqual(fds);
  });
});
