import { describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { ask, useEngines } from '../helpers/engines.js';
import { tempDir } from '../helpers/tmp.js';

const { engine } = useEngines();

describe('the engine flows through a RAM tier holding coded chunks (CPU reference engine)', () => {
  it('restores through the coded RAM tier by both routes (memory made here, and the engine woken and mapped): same answer', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false, codec: 'vsnap-c1' });
    try {
      const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
      expect((await restoreEngine(snapshot, client, { tiers: { ram: cache } })).tier).toBe('store');
      expect(cache.usedBytes).toBeLessThan(snapshot.manifest.totalBytes); // the reference engine's BF16 weights, coded
      expect(await ask(client)).toEqual(before);

      await suspendEngine(store, 'ref', client);
      const filled = await restoreEngine(snapshot, client, { tiers: { ram: cache } });
      expect([filled.tier, filled.route]).toEqual(['ram', 'filled']);
      expect(await ask(client)).toEqual(before);

      client.lack('describe'); // an older plugin: the engine's wake, its export, mapped here
      await suspendEngine(store, 'ref', client);
      const mapped = await restoreEngine(snapshot, client, { tiers: { ram: cache } });
      expect([mapped.tier, mapped.route]).toEqual(['ram', 'mapped']);
      expect(await ask(client)).toEqual(before);
    } finally {
      client.lack();
      cache.close();
    }
  });
});
