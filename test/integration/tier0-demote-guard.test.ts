import { readSync, writeSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import type { VsnapError } from '../../src/errors.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { startEngine, type EngineOptions } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function engine(options: EngineOptions = {}) {
  const e = await startEngine(options);
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  cleanup.push(() => e.stop(), () => client.close());
  return client;
}

describe('tier 0: the dirty check before a demotion (SwapController)', () => {
  it('held weights that no longer equal their snapshot are kept, not released, even when that leaves no room', async () => {
    const GB = 1e9;
    const clients = [await engine({ seed: 1, model: 'a' }), await engine({ seed: 2, model: 'b' }), await engine({ seed: 3, model: 'c' })];
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    cleanup.push(() => resident.close());
    // a and b: awake 12 GB (4 GB of weights); c: 13 GB. Budget 16 GB: one awake engine and one
    // holding fit; c fits only once a's holding is demoted.
    const controller = await SwapController.create({
      store,
      tiers: { gpu: resident },
      engines: clients.map((client, i) => ({ name: ['a', 'b', 'c'][i]!, client, memoryBytes: (i === 2 ? 13 : 12) * GB, weightsBytes: 4 * GB })),
      budgets: { 0: 16 * GB },
      queue: { limit: 100 },
    });
    cleanup.push(() => controller.close());
    const failures: Array<{ engine: string; action: string; error: VsnapError }> = [];
    controller.on('swapFailed', (e: { engine: string; action: string; error: VsnapError }) => failures.push(e));
    const use = async (name: string) => (await controller.acquire(name)).release();
    await use('a');
    await use('b'); // a suspended, its weights held in tier 0
    const held = resident.peek(clients[0]!.baseUrl);
    expect(held).toBeDefined();
    // A weight update raced the suspend: one held byte differs from the snapshot.
    const rank = held!.ranks[0]!;
    const byte = Buffer.alloc(1);
    readSync(rank.fds[0]!, byte, 0, 1, 123);
    writeSync(rank.fds[0]!, Buffer.from([byte[0]! ^ 0xff]), 0, 1, 123);

    // c needs room: b is suspended, then a's holding would be demoted, but its check fails
    await expect(use('c')).rejects.toMatchObject({ code: 'E_BUSY' });
    expect(resident.peek(clients[0]!.baseUrl)).toBeDefined(); // kept: releasing would lose the new bytes
    expect(failures).toMatchObject([{ engine: 'a', action: 'demote', error: { code: 'E_STALE' } }]);
    expect(controller.usage()[0]).toBeLessThanOrEqual(16 * GB);
    await expect(use('c')).rejects.toMatchObject({ code: 'E_BUSY' }); // and a stays held: never picked for demotion again
    expect(failures).toHaveLength(1);
    await use('b'); // the others are still served
  });
});
