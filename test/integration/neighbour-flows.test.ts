import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { NeighbourTier } from '../../src/cache/neighbour-tier.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, dirtyCheckPhases, startEngine, type TestEngine } from '../helpers/engine.js';
import { FaultyClient } from '../helpers/faults.js';
import { hostPeerBackend } from '../helpers/neighbour.js';
import { tempDir } from '../helpers/tmp.js';

// restoreEngine / suspendEngine with the neighbour tier, on the CPU reference engine (real plugin,
// real socket, real digests): the "GPUs" are memfds and the peer copy a host copy
// (test/helpers/neighbour.ts). test/gpu/neighbour.gpu.test.ts runs the tier on two GPUs.

const running: Array<TestEngine | EngineClient | NeighbourTier> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x instanceof NeighbourTier ? x.close() : x.stop());
});

async function setup() {
  const e = await startEngine();
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  const store = await RegionStore.open(tempDir());
  const expected = (await askCapital(client, 8)).ids;
  const snap = await captureEngine(store, 'ref', client);
  const peer = hostPeerBackend();
  const tier = NeighbourTier.create({ device: 1, budgetBytes: 1 << 30, backend: peer.backend });
  running.push(tier);
  const warnings: string[] = [];
  return { engine: e, client, store, snap, peer, tier, warnings, onWarning: (m: string) => warnings.push(m), answer: async () => (await askCapital(client, 8)).ids, expected };
}

describe('restoreEngine and suspendEngine with the neighbour tier (CPU reference engine, host peer backend)', () => {
  it('a suspend parks the weights before the sleep; the restore comes from the neighbour, verified, same answer', async () => {
    const s = await setup();
    const suspended = await suspendEngine(s.store, 'ref', s.client, { onWarning: s.onWarning, tiers: { neighbour: s.tier } });
    expect(suspended.parked).toMatchObject({ device: 1, already: false });
    expect(suspended.parked!.bytes).toBe(s.tier.usedBytes);
    expect(Object.keys(suspended.phases)).toEqual(['status', ...dirtyCheckPhases(), 'park', 'sleep']);
    expect(s.tier.ids()).toEqual([s.snap.id]);
    expect(s.peer.copies).toEqual([{ device: 0, restore: false, bytes: s.snap.manifest.totalBytes }]);

    const report = await restoreEngine(s.snap, s.client, { onWarning: s.onWarning, tiers: { neighbour: s.tier } });
    expect(report.tier).toBe('neighbour');
    expect(report.bytes).toBe(s.snap.manifest.totalBytes);
    expect(Object.keys(report.phases)).toEqual(['prepare', 'wakeWeights', 'export', 'validate', 'map', 'hydrate', 'verifyDigests', 'wakeKvCache', 'resetPrefixCache', 'expectedResponse']);
    expect(s.peer.copies.at(-1)).toEqual({ device: 0, restore: true, bytes: s.snap.manifest.totalBytes });
    expect(await s.answer()).toEqual(s.expected);
    expect(s.warnings).toEqual([]);

    // parked copies stay (a second suspend copies nothing), until evicted
    const again = await suspendEngine(s.store, 'ref', s.client, { tiers: { neighbour: s.tier } });
    expect(again.parked).toMatchObject({ already: true, seconds: 0 });
    expect(s.peer.copies).toHaveLength(2);
    expect(s.tier.evict(s.snap.id)).toBe(true);
    const fromStore = await restoreEngine(s.snap, s.client, { onWarning: s.onWarning, tiers: { neighbour: s.tier } });
    expect(fromStore.tier).toBe('store');
    expect(await s.answer()).toEqual(s.expected);
    expect(s.peer.openCount()).toBe(0);
  });

  it('falls back to the store when the peer copy fails, or the parked copy is damaged (then evicted)', async () => {
    const s = await setup();
    await suspendEngine(s.store, 'ref', s.client, { tiers: { neighbour: s.tier } });
    s.peer.hooks.failRestoreCopy = true;
    const r1 = await restoreEngine(s.snap, s.client, { onWarning: s.onWarning, tiers: { neighbour: s.tier } });
    expect(r1.tier).toBe('store');
    expect(s.warnings.join('\n')).toMatch(/neighbour tier on GPU 1 failed \(E_CUDA/);
    expect(await s.answer()).toEqual(s.expected);
    expect(s.tier.has(s.snap.id)).toBe(true); // a failed copy does not condemn the parked copy

    s.peer.hooks.failRestoreCopy = false;
    await suspendEngine(s.store, 'ref', s.client, { tiers: { neighbour: s.tier } });
    s.peer.damage();
    const r2 = await restoreEngine(s.snap, s.client, { onWarning: s.onWarning, tiers: { neighbour: s.tier } });
    expect(r2.tier).toBe('store');
    expect(s.warnings.at(-1)).toMatch(/E_DIGEST_MISMATCH/);
    expect(s.tier.has(s.snap.id)).toBe(false);
    expect(s.peer.openCount()).toBe(0);
    expect(await s.answer()).toEqual(s.expected);
  });

  it('an eviction during the restore\'s peer copy: the restore falls back, the memory is freed once the copy ends', async () => {
    const s = await setup();
    await suspendEngine(s.store, 'ref', s.client, { tiers: { neighbour: s.tier } });
    let openDuringCopy = -1;
    s.peer.hooks.beforeRestoreCopy = () => {
      expect(s.tier.evict(s.snap.id)).toBe(true); // the neighbour GPU needs its memory now
      openDuringCopy = s.peer.openCount(); // still held by the running copy
    };
    const report = await restoreEngine(s.snap, s.client, { onWarning: s.onWarning, tiers: { neighbour: s.tier } });
    expect(report.tier).toBe('store');
    expect(s.warnings.join('\n')).toMatch(/evicted from the neighbour tier on GPU 1 while it was being restored/);
    expect(openDuringCopy).toBeGreaterThan(0);
    expect(s.peer.openCount()).toBe(0);
    expect(s.tier.usedBytes).toBe(0);
    expect(await s.answer()).toEqual(s.expected);
  });

  it('a sleep that fails after the park: the engine stays awake and its parked copy is evicted, not left to nobody', async () => {
    const s = await setup();
    const faulty = new FaultyClient({ baseUrl: s.engine.url, token: s.engine.token });
    running.push(faulty);
    faulty.inject({ route: 'sleep' });
    await expect(suspendEngine(s.store, 'ref', faulty, { tiers: { neighbour: s.tier } })).rejects.toMatchObject({ code: 'E_ENGINE_HTTP' });
    expect(s.peer.copies).toHaveLength(1); // it was parked
    expect(s.tier.ids()).toEqual([]);
    expect(s.tier.usedBytes).toBe(0);
    expect(await s.answer()).toEqual(s.expected);
    expect(s.peer.openCount()).toBe(0);
  });

  it('a park that cannot be made never fails the suspend (no room in the tier: warned, not parked)', async () => {
    const s = await setup();
    const small = NeighbourTier.create({ device: 1, budgetBytes: 64 * 1024, backend: s.peer.backend });
    running.push(small);
    const suspended = await suspendEngine(s.store, 'ref', s.client, { onWarning: s.onWarning, tiers: { neighbour: small } });
    expect(suspended.parked).toBeUndefined();
    expect(s.warnings.join('\n')).toMatch(/were not parked on GPU 1: E_NO_SPACE/);
    expect((await s.client.wire.vsnapStatus()).sleeping).toBe(true);
    expect(s.peer.openCount()).toBe(0);
    // admit says no: skipped quietly
    const n = s.warnings.length;
    await restoreEngine(s.snap, s.client);
    const declined = await suspendEngine(s.store, 'ref', s.client, { onWarning: s.onWarning, tiers: { neighbour: { tier: s.tier, admit: () => false } } });
    expect(declined.parked).toBeUndefined();
    expect(s.warnings).toHaveLength(n);
    expect(s.tier.usedBytes).toBe(0);
  });
});
