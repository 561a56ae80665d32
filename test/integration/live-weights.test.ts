import { chmodSync, readFileSync, unlinkSync, writeFileSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it, vi } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { checkGpuHold } from '../../src/cache/gpu-tier.js';
import { VsnapError } from '../../src/errors.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, dirtyCheckPhases, engineDigests, startEngine, syncWeights, type TestEngine } from '../helpers/engine.js';
import { patternedRegions } from '../helpers/regions.js';
import { FaultyClient } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// Live weights (issue 11): an engine whose weights change in place is never put to sleep on a
// snapshot of its old weights. The CPU reference engine's weights are host memory, digested by
// the same code the GPU kernel runs.

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

async function engine() {
  const e = await startEngine({ args: ['--layers', '4'] });
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  return client;
}

const ask = async (client: EngineClient) => (await askCapital(client, 8)).ids;
/** An RL trainer's weight sync through vLLM's native API: the weights of `layers` (all when omitted) from another seed, in place. */
const updateWeights = (client: EngineClient, seed: number, layers?: number[]) => syncWeights(client.baseUrl, seed, layers);
const layer = (i: number) => `0/model.layers.${i}.mlp.weight`;

describe('live weights: the dirty check before a discard, incremental capture, verification after restore', () => {
  it('an in-place update is caught before the discard, only the changed region is captured again, and the restore answers with the new weights', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const first = await captureEngine(store, 'ref', client);
    expect(first.manifest.data.digestAlgorithm).toBe('vsnap-gd1');
    const before = await ask(client);

    await updateWeights(client, 2, [2]);
    const updated = await ask(client);
    expect(updated).not.toEqual(before);

    const suspended = await suspendEngine(store, 'ref', client);
    expect(suspended.captured).toBe(true);
    expect(suspended.liveCheck).toMatchObject({ checked: true, changed: [layer(2)], digestedIn: engineDigests() ? 'engine' : 'sdk' });
    expect(Object.keys(suspended.phases)).toEqual(['status', ...dirtyCheckPhases(), 'capture', 'sleep']);
    // Incremental: one region read again, the others shared with the first capture's blobs.
    const changedRegion = first.manifest.data.ranks[0]!.regions.find((r) => r.key === 'model.layers.2.mlp.weight')!;
    const second = suspended.snapshot;
    expect(second.id).not.toBe(first.id);
    expect(second.lastCapture).toMatchObject({ bytes: changedRegion.size, reusedBytes: first.manifest.totalBytes - changedRegion.size });
    const blobs = (s: Snapshot) => new Map(s.manifest.data.ranks[0]!.regions.map((r) => [r.key, r.blob]));
    for (const [key, blob] of blobs(first)) {
      if (key === changedRegion.key) expect(blobs(second).get(key)).not.toBe(blob);
      else expect(blobs(second).get(key), key).toBe(blob);
    }
    expect(second.manifest.data.expectedResponse!.tokenIds).toEqual(updated!.slice(0, 1)); // the default check generates one token

    const report = await restoreEngine(second, client);
    expect(Object.keys(report.phases)).toContain('verifyDigests');
    expect(await ask(client)).toEqual(updated);
    expect((await second.verify()).ok).toBe(true);
  });

  it.skipIf(!engineDigests())('the engine digests its own weights to the bits of the SDK: both dirty checks name the same regions', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    // Unchanged: every digest the workers compute equals the one the capture recorded here.
    const tables = await client.wire.vsnapDigest({ chunkSize: snap.manifest.data.ranks[0]!.regions[0]!.chunkSize });
    const recorded = new Map(snap.manifest.data.ranks[0]!.regions.map((r) => [r.key, r.digests]));
    expect(tables[0]!.regions.length).toBe(recorded.size);
    for (const r of tables[0]!.regions) expect(r.digests, r.key).toEqual(recorded.get(r.key));
    await updateWeights(client, 4, [0, 2]);
    const stale = async () => ((await suspendEngine(store, 'ref', client, { onStale: 'refuse' }).catch((e: unknown) => e)) as VsnapError).details.regions;
    const inEngine = await stale();
    client.lack('digest'); // a plugin without digest: the live weights are digested here
    try {
      expect(await stale()).toEqual(inEngine);
    } finally {
      client.lack();
    }
    expect(inEngine).toEqual(expect.arrayContaining([layer(0), layer(2)])); // and the tensor repacked from layer 0 (anon:0)
  });

  it("onStale 'refuse': E_STALE names exactly the changed regions and the engine stays awake", async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    await captureEngine(store, 'ref', client);
    await updateWeights(client, 3, [1, 3]);
    const err = await suspendEngine(store, 'ref', client, { onStale: 'refuse' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).code).toBe('E_STALE');
    expect([...((err as VsnapError).details.regions as string[])].sort()).toEqual([layer(1), layer(3)]);
    expect((err as VsnapError).message).toMatch(/2 region\(s\)/);
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    expect((await store.history('ref')).length).toBe(1); // nothing was captured
  });

  it('unchanged and reloaded weights pass the check: nothing is captured again', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    const before = await ask(client);
    await updateWeights(client, 5);
    expect(await ask(client)).not.toEqual(before);
    await client.wire.collectiveRpc('reload_weights'); // vLLM's name: the configured checkpoint again
    expect(await ask(client)).toEqual(before);

    const suspended = await suspendEngine(store, 'ref', client, { onStale: 'refuse' });
    expect(suspended).toMatchObject({ captured: false, liveCheck: { checked: true, changed: [] } });
    expect(suspended.snapshot.id).toBe(snap.id);
    expect(suspended.liveCheck!.bytes).toBe(snap.manifest.totalBytes);
  });

  it('tier 0: held weights are checked against the snapshot before a demotion releases them', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    try {
      const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, tiers: { gpu: resident } });
      const held = resident.peek(client.baseUrl)!;
      expect(await checkGpuHold(s.snapshot.manifest, held)).toMatchObject({ checked: true, changed: [] });
      // One byte of one held region changes (the engine is asleep: nothing else writes there).
      const rank = held.ranks[0]!;
      const i = rank.regions.findIndex((r) => r.key === 'model.layers.3.mlp.weight');
      const byte = Buffer.alloc(1);
      readSync(rank.fds[i]!, byte, 0, 1, 777);
      writeSync(rank.fds[i]!, Buffer.from([byte[0]! ^ 0xff]), 0, 1, 777);
      expect(await checkGpuHold(s.snapshot.manifest, held)).toMatchObject({ checked: true, changed: [layer(3)] });
    } finally {
      resident.close();
    }
  });

  it('a version-1 snapshot (no digests) cannot be checked: refused with onStale refuse, else captured again in full', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    // Rewrite the manifest as version 1 wrote it.
    const path = join(store.root, 'snapshots', 'ref', `${snap.id}.json`);
    const v1 = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown> & { ranks: Array<{ regions: Array<Record<string, unknown>> }> };
    v1.schemaVersion = 1;
    delete v1.digestAlgorithm;
    for (const r of v1.ranks) for (const region of r.regions) delete region.digests;
    chmodSync(path, 0o644);
    writeFileSync(path, JSON.stringify(v1));

    const err = await suspendEngine(store, 'ref', client, { onStale: 'refuse' }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_STALE', details: { checked: false, regions: [] } });
    const suspended = await suspendEngine(store, 'ref', client);
    expect(suspended.captured).toBe(true);
    expect(suspended.liveCheck).toMatchObject({ checked: false });
    expect(suspended.snapshot.lastCapture!.bytes).toBe(snap.manifest.totalBytes);
    expect(suspended.snapshot.manifest.data.digestAlgorithm).toBe('vsnap-gd1');
  });
});

describe('incremental capture and GPU-digest verification on plain regions', () => {
  it('re-reads only the regions that changed, and re-reads a region whose shared blob is gone', async () => {
    const sizes = { a: 3 * 4096 + 100, b: 8192, c: 4096 };
    const regions = patternedRegions(sizes);
    try {
      const store = await RegionStore.open(tempDir());
      const list = () => [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
      const base = await Snapshot.capture(store, 'inc', { regions: list(), chunkSize: 4096 });
      regions.get('b')!.write(5000, Buffer.from([0xee]));
      const next = await Snapshot.capture(store, 'inc', { regions: list(), chunkSize: 4096, base });
      expect(next.lastCapture).toMatchObject({ bytes: sizes.b, reusedBytes: sizes.a + sizes.c });
      const blob = (s: Snapshot, key: string) => s.manifest.data.ranks[0]!.regions.find((r) => r.key === key)!.blob;
      expect(blob(next, 'a')).toBe(blob(base, 'a'));
      expect(blob(next, 'b')).not.toBe(blob(base, 'b'));

      // The shared blob of 'c' disappears: the next incremental capture reads 'c' again.
      unlinkSync(store.blobPath(blob(base, 'c')));
      const third = await Snapshot.capture(store, 'inc', { regions: list(), chunkSize: 4096, base: next });
      expect(third.lastCapture).toMatchObject({ bytes: sizes.c, reusedBytes: sizes.a + sizes.b });
      expect((await third.verify()).ok).toBe(true);

      // Restoring the incremental capture into fresh regions gives the changed bytes.
      const targets = patternedRegions({ a: sizes.a, b: sizes.b, c: sizes.c });
      try {
        for (const r of targets.values()) r.write(0, Buffer.alloc(64, 0));
        const summary = await third.restore({ regions: [...targets].map(([key, r]) => ({ key, size: r.size, memory: r.memory })) });
        expect(summary.digestSeconds).toBeGreaterThanOrEqual(0);
        for (const key of ['a', 'b', 'c']) expect(targets.get(key)!.read(0, sizes[key as 'a']).equals(regions.get(key)!.read(0, sizes[key as 'a']))).toBe(true);
      } finally {
        for (const r of targets.values()) r.close();
      }
    } finally {
      for (const r of regions.values()) r.close();
    }
  });

  it('a restore whose memory does not match the GPU digests fails with E_DIGEST_MISMATCH naming region and chunk', async () => {
    const regions = patternedRegions({ w: 4 * 4096 });
    const target = patternedRegions({ w: 4 * 4096 }).get('w')!;
    try {
      const store = await RegionStore.open(tempDir());
      const snap = await Snapshot.capture(store, 'v', { regions: [{ key: 'w', size: 4 * 4096, memory: regions.get('w')!.memory }], chunkSize: 4096 });
      // A manifest whose digest of chunk 2 is not that of the stored (checksum-verified) bytes:
      // the host-side checks pass, only the digest of the restored memory can tell.
      const data = structuredClone(snap.manifest.toJSON()) as unknown as { ranks: Array<{ regions: Array<{ digests: string[] }> }> };
      data.ranks[0]!.regions[0]!.digests[2] = 'f'.repeat(32);
      const tampered = Snapshot.of(store, (await import('../../src/manifest/manifest.js')).Manifest.parse(data));
      const restoreInto = () => tampered.restore({ regions: [{ key: 'w', size: target.size, memory: target.memory }] });
      await expect(restoreInto()).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH', details: { regions: [{ region: '0/w', chunks: [2] }] } });
      // Off when asked: the same restore then succeeds.
      await expect(tampered.restore({ regions: [{ key: 'w', size: target.size, memory: target.memory }], verifyDigests: false })).resolves.toMatchObject({ bytes: 4 * 4096 });
    } finally {
      for (const r of regions.values()) r.close();
      target.close();
    }
  });
});
