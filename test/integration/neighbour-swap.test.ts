import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { NeighbourTier } from '../../src/cache/neighbour-tier.js';
import { captureEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapAgent } from '../../src/serve/agent.js';
import { SwapController, type SwapEvent } from '../../src/swap/controller.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { hostPeerBackend } from '../helpers/neighbour.js';
import { tempDir } from '../helpers/tmp.js';

// The SwapController with a neighbour-GPU tier over CPU reference engines and real HTTP: the
// parked copies live in memfds on "GPU 1" (test/helpers/neighbour.ts). The fake's allocation
// granularity is 1 GB, so an engine's parked footprint (one granule per region) is of the same
// order as the budgets and the accounting is exercised for real.

const GB = 1e9;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function fleet(n: number, cache?: RamTier) {
  const store = await RegionStore.open(tempDir());
  const engines: Array<{ client: EngineClient; name: string; expected: number[] | null; regions: number }> = [];
  for (let i = 1; i <= n; i++) {
    const e = await startEngine({ seed: i, model: `model-${i}` });
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    cleanup.push(() => e.stop(), () => client.close());
    const expected = (await askCapital(client, 6)).ids;
    const snap = await captureEngine(store, `model-${i}`, client, cache ? { ram: cache } : {});
    engines.push({ client, name: `model-${i}`, expected, regions: snap.manifest.data.ranks[0]!.regions.length });
  }
  return { store, engines };
}

function watch(controller: SwapController) {
  const swaps: SwapEvent[] = [];
  const parked: Array<{ engine: string; bytes: number; device: number }> = [];
  const evicted: Array<{ engine?: string; reason: string; for?: string }> = [];
  controller.on('swap', (e: SwapEvent) => swaps.push(e));
  controller.on('parked', (e: { engine: string; bytes: number; device: number }) => parked.push(e));
  controller.on('neighbourEvicted', (e: { engine?: string; reason: string; for?: string }) => evicted.push(e));
  return { swaps, parked, evicted, restores: () => swaps.filter((s) => s.action === 'restore') };
}

async function use(controller: SwapController, model: string): Promise<number[] | null> {
  const lease = await controller.acquire(model);
  try {
    return (await askCapital(lease.client, 6)).ids;
  } finally {
    lease.release();
  }
}

describe('SwapController with a neighbour-GPU tier (CPU reference engines, host peer backend)', () => {
  it('swap A→B→A: the second restore of A comes from the neighbour tier; an eviction mid-restore falls back to RAM', async () => {
    const cache = await RamTier.create({ budgetBytes: 64 << 20, pin: false });
    cleanup.push(() => cache.close());
    const { store, engines } = await fleet(2, cache);
    const peer = hostPeerBackend({ granularity: GB });
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 100 * GB, backend: peer.backend });
    cleanup.push(() => tier.close());
    const controller = await SwapController.create({
      store,
      tiers: { ram: cache, neighbour: tier },
      engines: engines.map((x) => ({ name: x.name, client: x.client, memoryBytes: 10 * GB })),
      budgets: { 0: 15 * GB },
    });
    cleanup.push(() => controller.close());
    const w = watch(controller);
    // at start one of the two was suspended (and parked); wake model-1, then model-2, then model-1
    for (const [i, model] of ['model-1', 'model-2', 'model-1'].entries()) {
      expect(await use(controller, model), `request ${i}`).toEqual(engines.find((e) => e.name === model)!.expected);
    }
    const footprint = engines[0]!.regions * GB;
    expect(w.parked.map((p) => p.device)).toEqual(w.parked.map(() => 1));
    expect(w.parked.every((p) => p.bytes === footprint)).toBe(true);
    const lastA = w.restores().filter((r) => r.engine === 'model-1').at(-1)!;
    expect(lastA.tier).toBe('neighbour');
    expect(Object.keys(lastA.phases!)).toContain('verifyDigests');
    // both parked: A's copy stays while it is awake (the next suspend copies nothing)
    const view = controller.neighbour()!;
    expect(view).toMatchObject({ device: 1, budgetBytes: 100 * GB, usedBytes: 2 * footprint });
    expect(new Set(view.entries.map((e) => e.engine))).toEqual(new Set(['model-1', 'model-2']));
    expect(controller.states().find((s) => s.name === 'model-2')).toMatchObject({ state: 'asleep', neighbourBytes: footprint });

    // the neighbour GPU needs its memory while model-2's restore copies from it: RAM tier instead
    peer.hooks.beforeRestoreCopy = () => {
      expect(tier.evict(view.entries.find((e) => e.engine === 'model-2')!.id)).toBe(true);
    };
    const warnings: string[] = [];
    controller.on('warning', (e: { message: string }) => warnings.push(e.message));
    expect(await use(controller, 'model-2')).toEqual(engines[1]!.expected);
    expect(w.restores().at(-1)).toMatchObject({ engine: 'model-2', tier: 'ram' });
    expect(warnings.join('\n')).toMatch(/evicted from the neighbour tier/);
    expect(peer.openCount()).toBe(engines[0]!.regions); // only model-1's parked copy is left
    expect(tier.usedBytes).toBe(footprint);

    const agent = await SwapAgent.listen({ controller, store });
    cleanup.push(() => agent.close());
    const status = (await (await request(`${agent.url}/api/status`)).body.json()) as { neighbourTier: unknown; engines: Array<{ name: string; neighbourBytes?: number }> };
    expect(status.neighbourTier).toEqual({ device: 1, budgetBytes: 100 * GB, usedBytes: footprint, entries: [{ id: expect.any(String), engine: 'model-1', bytes: footprint }] });
    expect(status.engines.find((e) => e.name === 'model-1')?.neighbourBytes).toBe(footprint);
    expect(status.engines.find((e) => e.name === 'model-2')?.neighbourBytes).toBeUndefined();
    const page = await (await request(`${agent.url}/`)).body.text();
    expect(page).toContain('<h2>Neighbour tier</h2>');
    const metrics = await (await request(`${agent.url}/metrics`)).body.text();
    // model-1 was suspended at start: both of its restores came from the neighbour, model-2's first one too
    expect(metrics).toMatch(/vsnap_neighbour_hits_total\{engine="model-1"\} 2/);
    expect(metrics).toMatch(/vsnap_neighbour_hits_total\{engine="model-2"\} 1/);
    expect(metrics).toMatch(new RegExp(`vsnap_neighbour_parked_bytes\\{device="1"\\} ${footprint}`));
    // parked once each; model-1's later suspends (3 in all) found its copy there already
    expect(metrics).toMatch(/vsnap_neighbour_parks_total\{engine="model-1",result="parked"\} 1/);
    expect(metrics).toMatch(/vsnap_neighbour_parks_total\{engine="model-1",result="already"\} 2/);
    expect(metrics).toMatch(/vsnap_neighbour_parks_total\{engine="model-2",result="parked"\} 1/);
    // the swap histogram's tier is the tier the weights were left in (a suspend) or came from (a restore)
    expect(metrics).toMatch(/vsnap_swap_seconds_count\{engine="model-1",action="suspend",tier="neighbour"\} 3/);
    expect(metrics).toMatch(/vsnap_swap_seconds_count\{engine="model-1",action="restore",tier="neighbour"\} 2/);
  });

  it('budget accounting: parked bytes count on the neighbour GPU, a wake there evicts them first, the tier evicts LRU within its budget', async () => {
    const { store, engines } = await fleet(3);
    const n = engines[0]!.regions;
    expect(n).toBeLessThanOrEqual(10); // the budgets below assume it
    const peer = hostPeerBackend({ granularity: GB });
    const budgets = { 0: 15 * GB, 1: (10 + n) * GB }; // GPU 1: model-3 awake plus one parked copy, or two parked copies
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 100 * GB, backend: peer.backend });
    const controller = await SwapController.create({
      store,
      engines: [
        { name: 'model-1', client: engines[0]!.client, memoryBytes: 10 * GB },
        { name: 'model-2', client: engines[1]!.client, memoryBytes: 10 * GB },
        { name: 'model-3', client: engines[2]!.client, memoryBytes: 10 * GB, devices: [1] },
      ],
      budgets,
      tiers: { neighbour: tier },
    });
    cleanup.push(() => controller.close());
    const w = watch(controller);
    let worst: Record<number, number> = {};
    const check = (): void => {
      const u = controller.usage();
      for (const d of [0, 1]) worst[d] = Math.max(worst[d] ?? 0, u[d] ?? 0);
    };
    controller.on('change', check);
    controller.on('parked', check);
    await controller.suspend('model-3');
    for (const model of ['model-1', 'model-2', 'model-1', 'model-3', 'model-2', 'model-1', 'model-3']) {
      expect(await use(controller, model)).toEqual(engines.find((e) => e.name === model)!.expected);
      check();
    }
    expect(worst[0]).toBeLessThanOrEqual(budgets[0]);
    expect(worst[1]).toBeLessThanOrEqual(budgets[1]);
    expect(w.evicted.some((e) => e.reason === 'room' && e.for === 'model-3')).toBe(true);
    expect(w.restores().some((r) => r.tier === 'neighbour')).toBe(true);
    expect(w.restores().filter((r) => r.engine === 'model-3').every((r) => r.tier !== 'neighbour')).toBe(true); // never parked: it runs on GPU 1
    await controller.close();
    expect(tier.closed).toBe(false); // a tier passed in stays the caller's
    tier.close();
    expect(peer.openCount()).toBe(0);
  });

  it('the tier evicts its least recently used entry to stay within its own budget, never the copy about to be restored', async () => {
    const { store, engines } = await fleet(3);
    const n = engines[0]!.regions;
    const peer = hostPeerBackend({ granularity: GB });
    const controller = await SwapController.create({
      store,
      engines: engines.map((x) => ({ name: x.name, client: x.client, memoryBytes: 10 * GB })),
      budgets: { 0: 15 * GB, 1: 100 * GB },
      tiers: { neighbour: NeighbourTier.create({ device: 1, budgetBytes: (n + 1) * GB, backend: peer.backend }) }, // one engine's copy
    });
    cleanup.push(() => controller.close());
    const w = watch(controller);
    // at start two of the three are suspended: the second park evicts the first (LRU); waking
    // model-1 suspends model-3, whose park evicts model-2's copy
    await use(controller, 'model-1');
    expect(w.evicted).toEqual([{ snapshotId: expect.any(String), engine: 'model-2', reason: 'lru' }]); // (the one at start came before watch())
    expect(controller.neighbour()!.entries.map((e) => e.engine)).toEqual(['model-3']);
    // waking model-3 suspends model-1, whose park would evict model-3's copy: skipped instead
    await use(controller, 'model-3');
    expect(w.restores().at(-1)).toMatchObject({ engine: 'model-3', tier: 'neighbour' });
    expect(w.evicted).toHaveLength(1);
    expect(controller.neighbour()!.usedBytes).toBeLessThanOrEqual((n + 1) * GB);
    const metrics = await controller.registry.metrics();
    expect(metrics).toMatch(/vsnap_neighbour_parks_total\{engine="model-1",result="skipped"\} 1/);
    expect(metrics).toMatch(/vsnap_neighbour_evictions_total\{reason="lru"\} 2/);
  });
});
