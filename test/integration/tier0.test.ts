import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { afterEach, describe, expect, it } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController, type SwapEvent } from '../../src/swap/controller.js';
import { askCapital, startEngine, type EngineOptions } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function engine(options: EngineOptions = {}) {
  const e = await startEngine(options);
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  cleanup.push(() => e.stop(), () => client.close());
  return { e, client };
}

const ask = async (client: EngineClient) => (await askCapital(client, 8)).ids;

describe('tier 0: weights kept on the "GPU" across sleep (CPU reference engine)', () => {
  for (const hooks of ['wrapped create_and_map', 'register_tag_hooks']) {
    it(`suspend keeps the weights, restore maps them back with no copy, 5 times (${hooks})`, async () => {
      const { client } = await engine(hooks === 'register_tag_hooks' ? { env: { VSNAP_REF_TAG_HOOKS: '1' } } : {});
      const store = await RegionStore.open(tempDir());
      const resident = new GpuTier();
      cleanup.push(() => resident.close());
      const before = await ask(client);
      for (let round = 0; round < 5; round++) {
        const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, tiers: { gpu: resident } });
        const status = await client.wire.vsnapStatus();
        expect(status.sleeping).toBe(true);
        expect(status.ranks[0]!.weightsMapped).toBe(false);
        expect(resident.entries()).toEqual([expect.objectContaining({ engine: client.baseUrl, snapshotId: s.snapshot.id, bytes: status.ranks[0]!.bytes })]);
        const report = await restoreEngine(s.snapshot, client, { tiers: { gpu: resident } });
        expect(report.tier).toBe('gpu');
        expect(Object.keys(report.phases)).toEqual(['prepare', 'adoptWeights', 'wakeKvCache', 'resetPrefixCache', 'expectedResponse']);
        expect(report.route).toBe('adopted');
        expect(resident.entries()).toEqual([]); // the engine holds its weights again
        expect(await ask(client)).toEqual(before);
      }
    });
  }

  it('falls back to the snapshot when the held weights no longer fit the engine (it was restarted)', async () => {
    const a = await engine({ seed: 1 });
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    cleanup.push(() => resident.close());
    const before = await ask(a.client);
    const s = await suspendEngine(store, 'ref', a.client, { captureIfNeeded: true, tiers: { gpu: resident } });
    // A new engine process of the same model at the same URL: the pids differ.
    const held = resident.peek(a.client.baseUrl)!;
    (held.ranks[0] as { pid: number }).pid = -1;
    const report = await restoreEngine(s.snapshot, a.client, { tiers: { gpu: resident } });
    expect(report.tier).toBe('store');
    expect(resident.entries()).toEqual([]);
    expect(await ask(a.client)).toEqual(before);
  });

  it('a crash of the SDK process holding tier 0: the engine stays asleep and restores from the store', async () => {
    const { e, client } = await engine();
    const root = tempDir();
    const before = await ask(client);
    const child = spawn(process.execPath, [fileURLToPath(new URL('../fixtures/gpu-tier-child.mjs', import.meta.url)), e.url, e.token, root], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => d.toString().includes('holding') && resolve());
      child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
    });
    child.kill('SIGKILL');
    await new Promise((r) => child.on('exit', r));
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    const report = await restoreEngine((await Snapshot.open(await RegionStore.open(root), 'ref')), client, { tiers: { gpu: new GpuTier() } });
    expect(report.tier).toBe('store');
    expect(await ask(client)).toEqual(before);
  });

  it('the controller keeps suspended weights in tier 0 while they fit, and demotes the oldest when room is needed', async () => {
    const GB = 1e9;
    const engines = [await engine({ seed: 1, model: 'a' }), await engine({ seed: 2, model: 'b' }), await engine({ seed: 3, model: 'c' })];
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    cleanup.push(() => resident.close());
    // awake: 12 GB each (4 GB of weights); budget 20 GB: one awake + up to 2 x 4 GB of tier-0 weights
    const controller = await SwapController.create({
      store,
      tiers: { gpu: resident },
      engines: engines.map((x, i) => ({ name: ['a', 'b', 'c'][i]!, client: x.client, memoryBytes: 12 * GB, weightsBytes: 4 * GB })),
      budgets: { 0: 20 * GB },
      queue: { limit: 100 },
    });
    cleanup.push(() => controller.close());
    let worst = 0;
    controller.on('change', () => (worst = Math.max(worst, controller.usage()[0]!)));
    const tiers: string[] = [];
    controller.on('swap', (e: SwapEvent) => e.action === 'restore' && tiers.push(`${e.engine}:${e.tier}`));
    const use = async (name: string) => (await controller.acquire(name)).release();
    for (const name of ['a', 'b', 'a', 'b', 'a', 'b', 'c', 'a']) await use(name);
    // the engines suspended to make room keep their weights while one awake + two held fit;
    // waking a held engine first demotes the oldest other holding when the budget demands it
    // a and b alternate: after each has been suspended once, their swaps move no bytes
    expect(tiers.slice(2, 6)).toEqual(['a:gpu', 'b:gpu', 'a:gpu', 'b:gpu']);
    expect(worst).toBeLessThanOrEqual(20 * GB);
    expect(resident.entries().length).toBeLessThanOrEqual(2);
    expect(controller.usage()[0]).toBeLessThanOrEqual(20 * GB);
  });
});
