import { afterEach, describe, expect, it } from 'vitest';

import { checkGpuHold, GpuTier } from '../../src/cache/gpu-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { FaultyClient } from '../helpers/faults.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, engineDigests, startEngine, syncWeights, type TestEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// A suspend into tier 0 needs the weights' export (tier 0 holds its descriptors) and the dirty
// check: the plugin sends the digests with the export, so one engine call serves both. A plugin
// whose export carries no digests is asked for them on their own, and the check is the same.

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

async function engine(): Promise<FaultyClient> {
  const e = await startEngine({ args: ['--layers', '4'] });
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  return client;
}

const layer = (i: number) => `0/model.layers.${i}.mlp.weight`;

describe.skipIf(!engineDigests())('tier 0: the dirty check carried by the export', () => {
  it('one export call with the digests, no digest call; a weight update is caught and captured, the held weights are the new ones', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    try {
      const first = await captureEngine(store, 'ref', client);
      await syncWeights(client.baseUrl, 6, [1]);
      const updated = (await askCapital(client, 8)).ids;
      client.log.length = 0;
      const s = await suspendEngine(store, 'ref', client, { tiers: { gpu: resident } });
      expect(client.log.filter((c) => c.route === 'digest')).toEqual([]);
      const exports = client.log.filter((c) => c.route === 'export');
      expect(exports).toHaveLength(1);
      expect(exports[0]!.args).toMatchObject({ digestChunkSize: first.manifest.data.ranks[0]!.regions[0]!.chunkSize });
      expect(Object.keys(s.phases)).toEqual(['status', 'digest', 'check', 'capture', 'hold', 'sleep']);
      expect(s).toMatchObject({ captured: true, tier: 'gpu', liveCheck: { checked: true, changed: [layer(1)], digestedIn: 'engine' } });
      expect(s.snapshot.id).not.toBe(first.id);
      // What tier 0 holds is what the new snapshot says, and the restore from it answers as the updated engine did.
      expect(await checkGpuHold(s.snapshot.manifest, resident.peek(client.baseUrl)!)).toMatchObject({ checked: true, changed: [] });
      const report = await restoreEngine(s.snapshot, client, { tiers: { gpu: resident } });
      expect(report.tier).toBe('gpu');
      expect((await askCapital(client, 8)).ids).toEqual(updated);
    } finally {
      resident.close();
    }
  });

  it('unchanged weights: nothing captured, and the same digests as the digest route gives', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    try {
      const first = await captureEngine(store, 'ref', client);
      const chunkSize = first.manifest.data.ranks[0]!.regions[0]!.chunkSize;
      const own = await client.wire.vsnapDigest({ chunkSize });
      const s = await suspendEngine(store, 'ref', client, { tiers: { gpu: resident }, onStale: 'refuse' });
      expect(s).toMatchObject({ captured: false, tier: 'gpu', liveCheck: { checked: true, changed: [] } });
      expect(s.snapshot.id).toBe(first.id);
      expect(s.liveCheck!.bytes).toBe(first.manifest.totalBytes);
      expect(own[0]!.regions.map((r) => r.digests)).toEqual(first.manifest.data.ranks[0]!.regions.map((r) => r.digests)); // the route agrees with the capture
    } finally {
      resident.close();
    }
  });

  it('an export without digests (an older plugin): the digests are asked for on their own, and a stale weight still refuses', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    try {
      await captureEngine(store, 'ref', client);
      await syncWeights(client.baseUrl, 7, [2]);
      client.lack('exportDigests'); // the body an older plugin acts on: it reads socket and nonces only
      client.calls.length = 0;
      const err = await suspendEngine(store, 'ref', client, { tiers: { gpu: resident }, onStale: 'refuse' }).catch((e: unknown) => e);
      client.lack();
      expect(err).toMatchObject({ code: 'E_STALE', details: { regions: [layer(2)] } });
      expect(client.calls.filter((r) => r === 'digest')).toHaveLength(1);
      expect(resident.has(client.baseUrl)).toBe(false); // refused before anything was held
      expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    } finally {
      resident.close();
    }
  });
});
