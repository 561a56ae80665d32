import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { GpuTier } from '../../src/cache/gpu-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { openFds, rssBytes } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

const CYCLES = Number(process.env.VSNAP_SOAK_CYCLES ?? 30);
const MiB = 1024 * 1024;

describe('soak (CPU reference engine, host backend)', () => {
  it(`${CYCLES} suspend/restore cycles through the store, the RAM tier and tier 0: every answer right, descriptors and RSS flat`, async () => {
    const e = await startEngine();
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    const cache = await RamTier.create({ budgetBytes: 64 * MiB, pin: false });
    const resident = new GpuTier();
    cleanup.push(() => e.stop(), () => client.close(), () => cache.close(), () => resident.close());
    const store = await RegionStore.open(tempDir());
    const expected = (await askCapital(client, 8)).ids;
    const tiers = ['store', 'ram', 'gpu'] as const;
    const cycle = async (i: number): Promise<void> => {
      const tier = tiers[i % 3]!;
      const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, ...(tier === 'gpu' ? { tiers: { gpu: resident } } : {}) });
      const report = await restoreEngine(snapshot, client, { tiers: { ...(tier === 'ram' ? { ram: cache } : {}), ...(tier === 'gpu' ? { gpu: resident } : {}) } });
      if (i >= 3) expect(report.tier).toBe(tier); // the first pass fills the RAM tier
      expect((await askCapital(client, 8)).ids, `cycle ${i}`).toEqual(expected);
    };
    const warmup = 6;
    for (let i = 0; i < warmup; i++) await cycle(i);
    const fds = openFds();
    const rss: number[] = [];
    for (let i = warmup; i < warmup + CYCLES; i++) {
      await cycle(i);
      if (i % 3 === 2) {
        global.gc?.();
        rss.push(rssBytes());
        expect(openFds(), `cycle ${i}`).toEqual(fds);
      }
    }
    const growth = rss.at(-1)! - rss[0]!;
    console.log(`soak: ${CYCLES} cycles; open descriptors ${fds.length} flat; RSS ${(rss[0]! / MiB).toFixed(1)} -> ${(rss.at(-1)! / MiB).toFixed(1)} MiB`);
    expect(resident.entries()).toEqual([]);
    // The weights are a few MiB: a leak of one copy or mapping per cycle would add far more.
    expect(growth).toBeLessThan(32 * MiB);
  });
});
