import { readFileSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { runTransfer } from '../../src/transfer/transfer.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { rejection } from '../helpers/rejection.js';
import { tempDir } from '../helpers/tmp.js';

// A suspend that captures into the RAM tier with its hash deferred (the default for persist
// 'off' / 'async'), on the CPU reference engine: a byte that flips in the RAM copy afterwards is
// caught by the GPU digest (here the same digest on the CPU) after the hydrate, before the engine
// is declared ready; it is left asleep with nothing of ours mapped.
const running: Array<TestEngine | EngineClient | RamTier | HostRegion> = [];
afterEach(async () => {
  for (const x of running.splice(0).reverse()) await (x instanceof EngineClient || x instanceof RamTier || x instanceof HostRegion ? x.close() : x.stop());
});
const memfdMappings = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:')).length;

/** Writes `bytes` over the RAM-tier copy of one region, through a real (unhashed) capture into it. */
async function overwriteInRam(cache: RamTier, id: string, key: string, bytes: Buffer): Promise<void> {
  const lease = cache.hold(id)!;
  const from = HostRegion.create(bytes.length);
  running.push(from);
  from.write(0, bytes);
  try {
    await runTransfer({ op: 'capture', label: 'overwrite', hash: false, regions: [{ name: key, size: bytes.length, chunkSize: 4096 * Math.ceil(bytes.length / 4096), memory: from.memory, hostCopy: { kind: 'buffer', buffer: lease.buffer, offset: lease.offsets.get(`0/${key}`)! } }] });
  } finally {
    lease.release();
  }
}

describe('restoreEngine of a capture with its hash deferred', () => {
  it('a byte flipped in the RAM copy is caught before the engine is ready; the engine stays asleep and restores once the copy is sound', async () => {
    const e = await startEngine();
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    running.push(e, client);
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    running.push(cache);
    const before = (await askCapital(client, 8)).ids;

    const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, capture: { ram: cache, persist: 'off' } });
    expect(s.snapshot.lastCapture?.hash).toBe('deferred');
    expect(s.snapshot.manifest.checksummed).toBe(false);
    const region = [...s.snapshot.manifest.regions()].find(({ region: r }) => r.key === 'model.embed_tokens.weight')!.region;
    const lease = cache.hold(s.snapshot.id)!;
    const sound = lease.buffer.read(lease.offsets.get(`0/${region.key}`)!, region.size);
    lease.release();
    const flipped = Buffer.from(sound);
    flipped[1000]! ^= 0x10;
    await overwriteInRam(cache, s.snapshot.id, region.key, flipped);

    const maps = memfdMappings();
    const err = await rejection(restoreEngine(s.snapshot, client, { tiers: { ram: cache }, verify: { digests: false } }));
    expect(err.code).toBe('E_DIGEST_MISMATCH');
    expect(JSON.stringify(err.details)).toContain(`0/${region.key}`);
    const status = await client.wire.vsnapStatus();
    expect(status.sleeping).toBe(true);
    expect(status.ranks[0]!.weightsMapped).toBe(false);
    expect(memfdMappings()).toBe(maps);

    await overwriteInRam(cache, s.snapshot.id, region.key, sound);
    expect((await restoreEngine(s.snapshot, client, { tiers: { ram: cache } })).tier).toBe('ram');
    expect((await askCapital(client, 8)).ids).toEqual(before);
    await s.snapshot.persist();
    expect((await store.current('ref'))?.id).toBe(s.snapshot.id);
  });
});
