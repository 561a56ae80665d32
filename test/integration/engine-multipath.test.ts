import { readdirSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { RamTier } from '../../src/cache/ram-tier.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// restoreEngine's `multipath` on the CPU reference engine: the real multi-path scheduler
// (native/transfer/multipath.cc) over the host backend, into the engine's exported regions.
// Which path takes which chunk is fixed with the host backend's schedule (testFaults.relayChunks:
// the neighbour path takes the last N chunks, the direct path waits for that), so that a fault
// injected on a path always fires there, however the two worker threads are scheduled.
const running: Array<TestEngine | EngineClient | RamTier> = [];
afterEach(async () => {
  for (const x of running.splice(0).reverse()) await (x instanceof RamTier ? x.close() : x instanceof EngineClient ? x.close() : x.stop());
});

async function setup(options: Parameters<typeof startEngine>[0] = {}) {
  const e = await startEngine(options);
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
  running.push(e, client, cache);
  const store = await RegionStore.open(tempDir());
  const before = (await askCapital(client, 8)).ids;
  const snap = await captureEngine(store, 'ref', client, { ram: cache });
  return { client, cache, store, snap, before };
}

describe('restoreEngine over two links (multipath)', () => {
  it('hydrates from the RAM tier over both paths, verifies, and answers as before', async () => {
    const { client, cache, store, snap, before } = await setup();
    await suspendEngine(store, 'ref', client);
    const warnings: string[] = [];
    const report = await restoreEngine(snap, client, {
      tiers: { ram: cache, multipath: { neighbour: 1, chunkSize: 64 * 1024, testFaults: { relayChunks: 8 } } },
      onWarning: (m) => warnings.push(m),
    });
    expect(report.tier).toBe('ram');
    expect(report.multipath).toBeDefined();
    expect(report.multipath!.bytesDirect + report.multipath!.bytesNeighbour).toBe(report.bytes);
    expect(report.multipath!.bytesNeighbour).toBeGreaterThan(0);
    expect(report.multipath!.bytesDirect).toBeGreaterThan(0);
    expect(report.phases.verifyDigests).toBeGreaterThanOrEqual(0);
    expect(warnings).toEqual([]);
    expect(await askCapital(client, 8).then((a) => a.ids)).toEqual(before);
  });

  it('a relay chunk failing is copied again over the direct path: the restore completes, verified', async () => {
    const { client, cache, store, snap, before } = await setup();
    await suspendEngine(store, 'ref', client);
    const report = await restoreEngine(snap, client, { tiers: { ram: cache, multipath: { neighbour: 1, chunkSize: 64 * 1024, testFaults: { failRelayAt: 1, relayChunks: 8 } } } });
    expect(report.multipath).toMatchObject({ requeuedChunks: 1, neighbourNote: expect.stringMatching(/injected fault/) });
    expect(await askCapital(client, 8).then((a) => a.ids)).toEqual(before);
  });

  it('a direct chunk failing fails the restore, puts the engine back to sleep, and the next restore works', async () => {
    const { client, cache, store, snap, before } = await setup();
    await suspendEngine(store, 'ref', client);
    const fds = readdirSync('/proc/self/fd').length;
    await expect(
      // the neighbour takes 4 chunks, the direct path all the others: its copy 2 always happens, and fails
      restoreEngine(snap, client, { tiers: { ram: cache, multipath: { neighbour: 1, chunkSize: 64 * 1024, testFaults: { failDirectAt: 2, relayChunks: 4 } } } }),
    ).rejects.toMatchObject({ message: expect.stringMatching(/injected fault: direct copy 2 failed/), details: { recovered: true } });
    expect(readdirSync('/proc/self/fd').length).toBe(fds); // no descriptor (nor the mapping it would hold) left
    const status = await client.wire.vsnapStatus();
    expect(status.sleeping).toBe(true);
    expect(status.ranks[0]!.weightsMapped).toBe(false);
    await restoreEngine(snap, client, { tiers: { ram: cache } });
    expect(await askCapital(client, 8).then((a) => a.ids)).toEqual(before);
  });

  it('an engine with two ranks restores over its own links and says why', async () => {
    const { client, cache, store, snap, before } = await setup({ tensorParallelSize: 2 });
    await suspendEngine(store, 'ref', client);
    const warnings: string[] = [];
    const report = await restoreEngine(snap, client, { onWarning: (m) => warnings.push(m), tiers: { ram: cache, multipath: { neighbour: 1 } } });
    expect(report.multipath).toBeUndefined();
    expect(warnings.join('\n')).toMatch(/multipath skipped: the engine has 2 ranks/);
    expect(await askCapital(client, 8).then((a) => a.ids)).toEqual(before);
  });
});

describe('SwapController with multipath', () => {
  it('restores engines on one GPU over both links, and says so in the swap event', async () => {
    const { SwapController } = await import('../../src/swap/controller.js');
    const engines = [];
    for (const i of [1, 2]) {
      const e = await startEngine({ seed: i, model: `model-${i}` });
      const client = new EngineClient({ baseUrl: e.url, token: e.token });
      running.push(e, client);
      engines.push({ name: `model-${i}`, client, answer: (await askCapital(client, 8)).ids });
    }
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    running.push(cache);
    const controller = await SwapController.create({
      store: await RegionStore.open(tempDir()),
      tiers: { ram: cache, multipath: { neighbour: 1, chunkSize: 64 * 1024, testFaults: { relayChunks: 4 } } },
      engines: engines.map((e) => ({ name: e.name, client: e.client, memoryBytes: 10e9, asleepBytes: 1e9, devices: [0] })),
      budgets: { 0: 15e9 },
    });
    const restores: Array<{ tier?: string; bytesViaNeighbour?: number }> = [];
    controller.on('swap', (e: { action: string; tier?: string; bytesViaNeighbour?: number }) => {
      if (e.action === 'restore') restores.push(e);
    });
    try {
      for (const round of [0, 1]) {
        for (const e of engines) {
          const lease = await controller.acquire(e.name);
          try {
            expect((await askCapital(lease.client, 8)).ids, `round ${round}`).toEqual(e.answer);
          } finally {
            lease.release();
          }
        }
      }
    } finally {
      await controller.close();
    }
    const fromRam = restores.filter((r) => r.tier === 'ram');
    expect(fromRam.length).toBeGreaterThan(0);
    for (const r of fromRam) expect(r.bytesViaNeighbour).toBeGreaterThan(0);
  });
});
