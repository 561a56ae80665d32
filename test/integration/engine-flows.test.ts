import { chmodSync, closeSync, openSync, readFileSync, writeSync } from 'node:fs';

import { describe, expect, it, vi } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { VsnapError } from '../../src/errors.js';
import { firstRegions } from '../../src/flows/fill.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { captureEngine, restoreEngine, suspendEngine, type EngineRestoreReport } from '../../src/flows/index.js';
import { restoreEngineWith } from '../../src/flows/restore.js';
import { RESTORE_PHASES } from '../../src/flows/phases.js';
import { RegionStore } from '../../src/store/region-store.js';
import { ask, useEngines } from '../helpers/engines.js';
import { dirtyCheckPhases, engineDigests } from '../helpers/engine.js';
import { fillInodes, openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const { engine } = useEngines();

/** A report lists its phases in its route's order (flows/phases.ts), only phases of that route. */
function expectRouteOrder(report: EngineRestoreReport): void {
  const order: readonly string[] = RESTORE_PHASES[report.route];
  const at = Object.keys(report.phases).map((p) => order.indexOf(p));
  expect(at, Object.keys(report.phases).join(', ')).not.toContain(-1);
  expect(at).toEqual([...at].sort((a, b) => a - b));
}


describe('capture, suspend and restore a running engine (CPU reference engine, real plugin, real socket)', () => {
  it('round-trips the weights: same answer after sleep level 2 and restore', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    expect(before).toHaveLength(8);

    const snap = await captureEngine(store, 'ref', client);
    const m = snap.manifest.data;
    expect(m.engine).toMatchObject({ kind: 'vllm', version: '0.0.0+vsnap.reference', pluginVersion: '0.1.0', attentionBackend: 'TRITON_ATTN' });
    expect(m.model).toMatchObject({ id: 'vsnap/reference-host-1', revision: 'seed-1', dtype: 'bfloat16', tensorParallelSize: 1 });
    expect(m.platform.kind).toBe('host');
    // the default check: the prompt scored (one logprob per byte token after the first) and one token generated
    expect(m.expectedResponse).toMatchObject({ prompt: 'The capital of France is', maxTokens: 1 });
    expect(m.expectedResponse?.tokenIds).toHaveLength(1);
    expect(m.expectedResponse?.promptTokenIds).toEqual([...Buffer.from('The capital of France is')]);
    expect(m.expectedResponse?.promptLogprobs).toHaveLength('The capital of France is'.length - 1);
    const keys = m.ranks[0]!.regions.map((r) => r.key);
    expect(keys).toContain('model.embed_tokens.weight');
    expect(keys).toContain('model.layers.0.mlp.weight');
    expect(keys).toContain('anon:0'); // the repacked tensor made after loading: no name, still captured
    const layer = m.ranks[0]!.regions.find((r) => r.key === 'model.layers.0.mlp.weight')!;
    expect(layer.tensors.map((t) => t.name)).toEqual(['model.layers.0.mlp.weight', 'model.layers.0.mlp.scales']);

    client.calls.length = 0;
    const suspended = await suspendEngine(store, 'ref', client);
    const inEngine = engineDigests();
    expect(suspended).toMatchObject({ captured: false, alreadyAsleep: false, liveCheck: { checked: true, changed: [], digestedIn: inEngine ? 'engine' : 'sdk' } });
    // The dirty check in one call: the engine's workers digest their own weights, nothing is exported.
    expect(Object.keys(suspended.phases)).toEqual(['status', ...dirtyCheckPhases(), 'sleep']);
    expect(client.calls.filter((c) => c === 'export')).toHaveLength(inEngine ? 0 : 1);
    const asleep = await client.wire.vsnapStatus();
    expect(asleep.sleeping).toBe(true);
    expect(asleep.ranks[0]!.weightsMapped).toBe(false);

    // The default targets: the region table read while asleep, memory made and filled here while the
    // engine's wake of its weights adopts it (flows/fill.ts).
    const report = await restoreEngine(snap, client);
    expect(Object.keys(report.phases)).toEqual(['prepare', 'allocate', 'hydrate', 'verifyDigests', 'wakeWeightsWait', 'describe', 'validate', 'allocateRest', 'wakeWeights', 'wakeKvCache', 'resetPrefixCache', 'expectedResponse']);
    expect(report.overlapped).toEqual(['describe', 'validate', 'allocateRest', 'wakeWeights']);
    expect(report.route).toBe('filled');
    expectRouteOrder(report);
    expect(report.bytes).toBe(snap.manifest.totalBytes);
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    expect(await ask(client)).toEqual(before);

    // twice more, the second through the RAM tier
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    try {
      for (const tier of ['store', 'ram']) {
        await suspendEngine(store, 'ref', client);
        expect((await restoreEngine(snap, client, { tiers: { ram: cache } })).tier).toBe(tier);
        expect(await ask(client)).toEqual(before);
      }
      // The other targets (a plugin that cannot describe its regions asleep): the engine's wake first, then its export, mapped here.
      client.lack('describe');
      await suspendEngine(store, 'ref', client);
      const woken = await restoreEngine(snap, client, { tiers: { ram: cache } });
      expect(Object.keys(woken.phases)).toEqual(['prepare', 'wakeWeights', 'export', 'validate', 'map', 'hydrate', 'verifyDigests', 'wakeKvCache', 'resetPrefixCache', 'expectedResponse']);
      expect(woken.overlapped).toBeUndefined();
      expect(woken.route).toBe('mapped');
      expectRouteOrder(woken);
      expect(await ask(client)).toEqual(before);
    } finally {
      client.lack();
      cache.close();
    }
  });

  it('an engine whose plugin cannot describe its regions asleep is restored through its wake and export', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const { snapshot } = await suspendEngine(store, 'old-plugin', client, { captureIfNeeded: true });
    client.lack('describe'); // as an older plugin answers: no `describe` in its ranks' status
    const report = await restoreEngine(snapshot, client);
    expect(Object.keys(report.phases).slice(0, 3)).toEqual(['prepare', 'wakeWeights', 'export']);
    expect(await ask(client)).toEqual(before);
  });

  it("makes the first part of the weights' memory while the engine's status is read, and uses that memory; an engine that cannot adopt it leaves nothing behind", async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const { snapshot } = await suspendEngine(store, 'early', client, { captureIfNeeded: true });
    let atStatus: Set<number> | undefined;
    client.inject({ route: 'status', pass: true, times: Infinity, action: () => void (atStatus ??= fillInodes()) });
    let beforeWake: Set<number> | undefined;
    const fds = openFds();
    await restoreEngineWith(snapshot, client, {}, { beforeKvWake: async () => void (beforeWake = fillInodes()) });
    expect(atStatus!.size).toBeGreaterThan(0); // made before the engine answered
    for (const inode of atStatus!) expect(beforeWake!.has(inode), String(inode)).toBe(true); // and copied into, not made again
    expect(fillInodes().size).toBe(0);
    expect(openFds()).toEqual(fds);
    expect(await ask(client)).toEqual(before);

    // An older plugin (no describe while asleep): the restore goes through the engine's wake and export, the early memory is let go.
    await suspendEngine(store, 'early', client);
    atStatus = undefined;
    client.lack('describe');
    const report = await restoreEngine(snapshot, client);
    expect(atStatus!.size).toBeGreaterThan(0);
    expect(Object.keys(report.phases).slice(0, 3)).toEqual(['prepare', 'wakeWeights', 'export']);
    expect(fillInodes().size).toBe(0);
    expect(openFds()).toEqual(fds);
    expect(await ask(client)).toEqual(before);
    // An awake engine is refused: the memory made while it was read goes too.
    await expect(restoreEngine(snapshot, client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE' });
    expect(fillInodes().size).toBe(0);
    expect(openFds()).toEqual(fds);
    // The engine stops answering while it is read: the same.
    await suspendEngine(store, 'early', client);
    atStatus = undefined;
    client.clearFaults();
    client.inject({ route: 'status', action: () => void (atStatus = fillInodes()) }); // the engine is gone: its status fails
    await expect(restoreEngine(snapshot, client)).rejects.toMatchObject({ code: 'E_ENGINE_HTTP' });
    expect(atStatus!.size).toBeGreaterThan(0);
    expect(fillInodes().size).toBe(0);
    expect(openFds()).toEqual(fds);
  });

  it('without a restore, sleep level 2 loses the weights (the problem this solves)', async () => {
    const { client } = await engine();
    const before = await ask(client);
    await client.wire.vsnapSleep({ level: 2 });
    await client.wire.vsnapWake();
    expect(await ask(client)).not.toEqual(before);
  });

  it('empties the prefix cache beside the KV cache wake, once: the reset is asked for before the KV cache wakes', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const snap = await captureEngine(store, 'ref', client);
    await suspendEngine(store, 'ref', client);
    const resets = async (): Promise<number> => Number((await client.wire.collectiveRpc('ref_prefix_cache_resets'))![0]);
    const asleep = await resets();
    let seen = asleep;
    // The hook runs just before the KV cache's wake, which waits for it: it returns only once the
    // engine has counted the reset, so a restore that asked for the reset after the wake never
    // finishes (the test's timeout fails it). No timing: the reset was asked for before the hook ran.
    const beforeKvWake = async (): Promise<void> => {
      while (seen === asleep) seen = await resets();
    };
    const report = await restoreEngineWith(snap, client, {}, { beforeKvWake });
    expect(seen).toBe(asleep + 1);
    expect(await resets()).toBe(asleep + 1);
    expect(Object.keys(report.phases)).toEqual(expect.arrayContaining(['awaitRoom', 'wakeKvCache', 'resetPrefixCache']));
    expect(await ask(client)).toEqual(before);
  });

  it("counts the engine's status read in the restore's time (prepare): the clock starts when restoreEngine is called", async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    await suspendEngine(store, 'ref', client);
    // The status read made slow on purpose: with the clock started after it, prepare would miss it.
    let read: { started: number; ended: number } | undefined;
    client.inject({ route: 'status', pass: true, action: async () => {
      const started = performance.now();
      await new Promise((resolve) => setTimeout(resolve, 200));
      read ??= { started, ended: performance.now() };
    } });
    const report = await restoreEngine(snap, client);
    expect(read).toBeDefined();
    const phases = Object.entries(report.phases);
    expect(phases[0]![0]).toBe('prepare');
    expect(report.phases.prepare! * 1000).toBeGreaterThanOrEqual(read!.ended - read!.started);
    expect(report.seconds * 1000).toBeGreaterThanOrEqual(read!.ended - read!.started);
  });

  it('refuses to suspend without a restorable snapshot, and keeps the weights', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    await expect(suspendEngine(store, 'none', client)).rejects.toMatchObject({ code: 'E_NOT_RESTORABLE' });
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    expect(await ask(client)).toEqual(before);

    const done = await suspendEngine(store, 'none', client, { captureIfNeeded: true });
    expect(done.captured).toBe(true);
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    await restoreEngine(done.snapshot, client);
    expect(await ask(client)).toEqual(before);
  });

  it('refuses another model\'s snapshot, listing the differences, and leaves the engine asleep', async () => {
    const a = await engine({ seed: 1 });
    const b = await engine({ seed: 2 });
    const store = await RegionStore.open(tempDir());
    const snapB = await captureEngine(store, 'b', b.client);
    await suspendEngine(store, 'a', a.client, { captureIfNeeded: true });
    const fds = openFds();
    const err = await restoreEngine(snapB, a.client).catch((e: unknown) => e);
    expect(openFds()).toEqual(fds); // the memory made for it (from the snapshot's sizes, while the table was read) is let go
    expect(err).toMatchObject({ code: 'E_MANIFEST_MISMATCH' });
    const paths = (err as { details: { mismatches: Array<{ path: string }> } }).details.mismatches.map((m) => m.path);
    expect(paths).toEqual(expect.arrayContaining(['model.id', 'model.revision']));
    // Checked against the region table read while asleep: refused before the weights woke.
    expect((err as Error).message).toMatch(/the engine is asleep\./);
    const after = await a.client.wire.vsnapStatus();
    expect(after.sleeping).toBe(true);
    expect(after.ranks.map((r) => r.weightsMapped)).toEqual([false]);
  });

  it('memory for the rest of the regions cannot be made while the first are copied: the restore fails with why, nothing woke, nothing is left', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    try {
      const before = await ask(client);
      const { snapshot } = await suspendEngine(store, 'rest', client, { captureIfNeeded: true, tiers: { ram: cache } });
      const first = firstRegions([...snapshot.manifest.regions()].map(({ rank, region }) => ({ rank, key: region.key, tag: region.tag, size: region.size, tensors: region.tensors.length, device: undefined }))).size;
      const memfds = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:vsnap-fill')).length;
      const fds = openFds();
      const create = HostRegion.create.bind(HostRegion);
      let made = 0;
      const spy = vi.spyOn(HostRegion, 'create').mockImplementation((size, name) => {
        if (name === 'vsnap-fill' && ++made > first) throw new VsnapError('E_NO_SPACE', 'injected: no memory left for the rest');
        return create(size, name);
      });
      const err = await restoreEngine(snapshot, client, { tiers: { ram: cache } }).catch((e: unknown) => e);
      spy.mockRestore();
      expect(made).toBeGreaterThan(first); // the first part was made (and copied into) before the rest failed
      expect(err).toMatchObject({ code: 'E_NO_SPACE', message: expect.stringMatching(/could not be made/) });
      const status = await client.wire.vsnapStatus();
      expect(status.sleeping).toBe(true);
      expect(status.ranks.map((r) => r.weightsMapped)).toEqual([false]); // the engine's wake never ran
      expect(openFds()).toEqual(fds);
      expect(memfds()).toBe(0);
      await restoreEngine(snapshot, client, { tiers: { ram: cache } });
      expect(await ask(client)).toEqual(before);
    } finally {
      cache.close();
    }
  });

  it('swaps models of the same layout into a running server when asked', async () => {
    const a = await engine({ seed: 1 });
    const b = await engine({ seed: 2 });
    const store = await RegionStore.open(tempDir());
    const snapB = await captureEngine(store, 'b', b.client);
    const answerB = await ask(b.client);
    expect(await ask(a.client)).not.toEqual(answerB);
    const report = await restoreEngine(snapB, a.client, { allowModelSwap: true });
    expect(Object.keys(report.phases)[0]).toBe('sleep');
    expect(await ask(a.client)).toEqual(answerB);
  });

  it('a corrupted blob: refused, nothing of the bad chunk written, engine asleep and recoverable', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const snap = await captureEngine(store, 'ref', client);
    const region = snap.manifest.data.ranks[0]!.regions.find((r) => r.key === 'model.embed_tokens.weight')!;
    const path = store.blobPath(region.blob);
    chmodSync(path, 0o644);
    const fd = openSync(path, 'r+');
    writeSync(fd, Buffer.from([0xff, 0xfe]), 0, 2, 1000);
    closeSync(fd);
    await suspendEngine(store, 'ref', client);
    await expect(restoreEngine(snap, client)).rejects.toMatchObject({ code: 'E_CHECKSUM', details: { region: 'model.embed_tokens.weight', recovered: true } });
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);

    // recover: the snapshot is damaged, so capture again from an engine of the same model
    const twin = await engine({ seed: 1 });
    const good = await captureEngine(store, 'ref', twin.client);
    await restoreEngine(good, client);
    expect(await ask(client)).toEqual(before);
  });

  it('catches state outside the snapshot with the expected-response check (FlashInfer-like workspace)', async () => {
    const warnings: string[] = [];
    const { client } = await engine({ env: { VSNAP_REF_ATTENTION: 'FLASHINFER' } });
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'fi', client, { onWarning: (w) => warnings.push(w) });
    expect(warnings.join('\n')).toMatch(/FLASHINFER.*TRITON_ATTN/s);
    await suspendEngine(store, 'fi', client, { onWarning: () => undefined });
    const err = await restoreEngine(snap, client, { onWarning: () => undefined }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_RESPONSE_MISMATCH' });
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
  });

  it('works with the official register_tag_hooks interface of newer vLLM', async () => {
    const { client } = await engine({ env: { VSNAP_REF_TAG_HOOKS: '1' } });
    expect((await client.wire.vsnapStatus()).ranks[0]).toMatchObject({ hooks: 'register_tag_hooks' });
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    await suspendEngine(store, 'th', client, { captureIfNeeded: true });
    await restoreEngine((await Snapshot.open(store, 'th')), client);
    expect(await ask(client)).toEqual(before);
  });

  it('falls back to the dev routes where the plugin cannot add its own', async () => {
    const { client } = await engine({ env: { VSNAP_REF_NO_BUILD_APP: '1' } });
    await expect(client.wire.vsnapStatus()).rejects.toMatchObject({ details: { status: 404 } });
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const snap = await captureEngine(store, 'dev', client);
    expect(snap.manifest.data.engine?.pluginVersion).toBe('0.1.0');
    await suspendEngine(store, 'dev', client);
    expect(await client.wire.isSleeping()).toBe(true);
    await restoreEngine(snap, client);
    expect(await ask(client)).toEqual(before);

    const neither = await engine({ env: { VSNAP_REF_NO_BUILD_APP: '1' }, devMode: false });
    await expect(captureEngine(store, 'x', neither.client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE', message: expect.stringMatching(/VLLM_SERVER_DEV_MODE=1/) });
  });

  it('refuses to capture an engine without sleep mode, or an asleep one', async () => {
    const off = await engine({ sleepMode: false });
    const store = await RegionStore.open(tempDir());
    await expect(captureEngine(store, 'x', off.client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE', message: expect.stringMatching(/--enable-sleep-mode/) });
    const on = await engine();
    await on.client.wire.vsnapSleep({ level: 1 });
    await expect(captureEngine(store, 'x', on.client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE' });
  });

  it("a suspend can capture into the RAM tier with persist 'async': the restore comes from RAM, the store gets it in the background", async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    try {
      const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, capture: { ram: cache, persist: 'async' } });
      expect(s.captured).toBe(true);
      expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
      const report = await restoreEngine(s.snapshot, client, { tiers: { ram: cache } });
      expect(report.tier).toBe('ram');
      expect(await ask(client)).toEqual(before);
      await s.snapshot.persist();
      expect((await store.current('ref'))?.id).toBe(s.snapshot.id);
      // durable now: the next suspend needs no capture
      expect(await suspendEngine(store, 'ref', client)).toMatchObject({ captured: false });
    } finally {
      cache.close();
    }
  });
});
