// Captures whose store blobs are coded (CaptureOptions.codec 'vsnap-c1', docs/compression.md) and
// restores from the store with no RAM tier (host backend: decoded on the CPU): bit-exact round
// trips, regions that do not shrink kept raw, a damaged coded chunk refused naming its region and
// chunk with the targets untouched, raw snapshots restored as before, persist from the RAM tier
// and incremental captures sharing coded blobs.
import { readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { RamTier } from '../../src/cache/ram-tier.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { codedOffsets, storedBytes } from '../../src/store/coded-blob.js';
import { RegionStore } from '../../src/store/region-store.js';
import { randomChunk, weights } from '../helpers/codec-data.js';
import { allBytes, fillRegion } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const KiB = 1024;
const CHUNK = 256 * KiB;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

const contents: Record<string, Buffer> = {
  'bf16.layers.0.weight': weights('bf16', 'gaussian', 3 * CHUNK + 1000, 7),
  'fp32.norm': weights('fp32', 'heavy', CHUNK + 4096, 8),
  'random.bias': randomChunk(CHUNK / 2 + 12, 9),
};

function dtypeOf(key: string): string | undefined {
  if (key.startsWith('bf16')) return 'torch.bfloat16';
  if (key.startsWith('fp32')) return 'torch.float32';
  return undefined;
}

function regionsOf(data: Record<string, Buffer>) {
  return Object.entries(data).map(([key, bytes]) => {
    const r = HostRegion.create(bytes.length);
    cleanup.push(r);
    r.write(0, bytes);
    const dtype = dtypeOf(key);
    return { key, size: bytes.length, memory: r.memory, tensors: dtype ? [{ name: key, offset: 0, dtype, shape: [bytes.length] }] : [] };
  });
}

function targetsOf(data: Record<string, Buffer>) {
  return Object.entries(data).map(([key, bytes]) => {
    const r = HostRegion.create(bytes.length);
    cleanup.push(r);
    fillRegion(r, 0xa5);
    return { key, size: bytes.length, memory: r.memory, region: r };
  });
}

const asTarget = ({ key, size, memory }: { key: string; size: number; memory: HostRegion['memory'] }) => ({ key, size, memory });

/** Replaces a published (read-only) blob with other bytes. */
function rewrite(path: string, bytes: Uint8Array): void {
  rmSync(path);
  writeFileSync(path, bytes);
}

describe('capture with codec vsnap-c1 writes coded store blobs', () => {
  it('codes the regions that shrink, keeps the others raw, and restores from the store bit-exact without a RAM tier', async () => {
    const store = await RegionStore.open(tempDir());
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: CHUNK, codec: 'vsnap-c1' });
    const byKey = new Map([...snap.manifest.regions()].map(({ region }) => [region.key, region]));
    const bf16 = byKey.get('bf16.layers.0.weight')!;
    expect(bf16.codec?.codedSizes).toHaveLength(4);
    expect(statSync(store.blobPath(bf16.blob)).size).toBe(storedBytes(bf16));
    expect(storedBytes(bf16) / bf16.size).toBeLessThan(0.75);
    expect(byKey.get('fp32.norm')!.codec).toBeDefined();
    expect(byKey.get('random.bias')!.codec).toBeUndefined(); // nothing shrank: the raw blob, as a raw capture names it
    expect(statSync(store.blobPath(byKey.get('random.bias')!.blob)).size).toBe(contents['random.bias']!.length);
    expect(snap.manifest.storedBytes).toBeLessThan(snap.manifest.totalBytes);
    expect((await store.verify('m')).ok).toBe(true);

    const targets = targetsOf(contents);
    const opened = await Snapshot.open(store, 'm');
    const result = await opened.restore({ regions: targets.map(asTarget) });
    expect(result.tier).toBe('store');
    for (const t of targets) expect(t.region.read(0, t.size).equals(contents[t.key]!)).toBe(true);
  });

  it('stores the same bytes raw by default, and a raw snapshot restores as before', async () => {
    const store = await RegionStore.open(tempDir());
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: CHUNK });
    for (const { region } of snap.manifest.regions()) {
      expect(region.codec).toBeUndefined();
      expect(statSync(store.blobPath(region.blob)).size).toBe(region.size);
    }
    const targets = targetsOf(contents);
    await (await Snapshot.open(store, 'm')).restore({ regions: targets.map(asTarget) });
    for (const t of targets) expect(t.region.read(0, t.size).equals(contents[t.key]!)).toBe(true);
  });

  it('refuses an unknown codec before anything is read', async () => {
    const store = await RegionStore.open(tempDir());
    const err = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), codec: 'zstd' as 'off' }).catch((e: VsnapError) => e);
    expect(err).toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    expect((await store.list()).length).toBe(0);
  });

  it('refuses a damaged coded chunk naming its region and chunk, and writes nothing into any target', async () => {
    const store = await RegionStore.open(tempDir());
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: CHUNK, codec: 'vsnap-c1' });
    const bf16 = [...snap.manifest.regions()].find(({ region }) => region.key === 'bf16.layers.0.weight')!.region;
    const path = store.blobPath(bf16.blob);
    const good = readFileSync(path);
    const offsets = codedOffsets(bf16.codec!);

    const structural = Buffer.from(good);
    structural[offsets[2]! + 5] = 9; // chunk 2's mode
    rewrite(path, structural);
    const targets = targetsOf(contents);
    const err = await (await Snapshot.open(store, 'm')).restore({ regions: targets.map(asTarget) }).catch((e: VsnapError) => e);
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).code).toBe('E_CODEC_CORRUPT');
    expect((err as VsnapError).message).toContain('chunk 2 of region bf16.layers.0.weight in snapshot m is damaged');
    expect((err as VsnapError).details).toMatchObject({ chunk: 2, region: 'bf16.layers.0.weight' });
    for (const t of targets) expect(allBytes(t.region, 0xa5)).toBe(true);

    const content = Buffer.from(good);
    content[offsets[2]! - 100] = content[offsets[2]! - 100]! ^ 0x01; // inside chunk 1's exceptions or rest bits: decodes, to other bytes
    rewrite(path, content);
    const err2 = await (await Snapshot.open(store, 'm')).restore({ regions: targets.map(asTarget) }).catch((e: VsnapError) => e);
    expect((err2 as VsnapError).code).toMatch(/^E_CHECKSUM$|^E_CODEC_CORRUPT$/);
    expect((err2 as VsnapError).details).toMatchObject({ chunk: 1, region: 'bf16.layers.0.weight' });
    for (const t of targets) expect(allBytes(t.region, 0xa5)).toBe(true);

    rewrite(path, good);
    await (await Snapshot.open(store, 'm')).restore({ regions: targets.map(asTarget) });
    for (const t of targets) expect(t.region.read(0, t.size).equals(contents[t.key]!)).toBe(true);
  });

  it('a RAM tier holding raw bytes loads a coded snapshot from the store (decoded and checked) and restores it bit-exact', async () => {
    const store = await RegionStore.open(tempDir());
    await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: CHUNK, codec: 'vsnap-c1' });
    const cache = await RamTier.create({ budgetBytes: 8 * 1024 * KiB, pin: false });
    cleanup.push(cache);
    const snap = await Snapshot.open(store, 'm');
    for (const tier of ['store', 'ram']) {
      const targets = targetsOf(contents);
      expect((await snap.restore({ regions: targets.map(asTarget), ram: cache })).tier).toBe(tier);
      for (const t of targets) expect(t.region.read(0, t.size).equals(contents[t.key]!)).toBe(true);
    }
  });

  it('a capture landing in a coded RAM tier and the store at once (persist sync) codes both, and restores from each', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 8 * 1024 * KiB, pin: false, codec: 'vsnap-c1' });
    cleanup.push(cache);
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: CHUNK, ram: cache, codec: 'vsnap-c1' });
    expect(cache.has(snap.id)).toBe(true);
    expect(cache.usedBytes).toBeLessThan(snap.manifest.totalBytes);
    expect(snap.manifest.storedBytes).toBeLessThan(snap.manifest.totalBytes);
    for (const [tier, via] of [['ram', cache], ['store', undefined]] as const) {
      const targets = targetsOf(contents);
      expect((await snap.restore({ regions: targets.map(asTarget), ...(via ? { ram: via } : {}) })).tier).toBe(tier);
      for (const t of targets) expect(t.region.read(0, t.size).equals(contents[t.key]!)).toBe(true);
    }
  });

  it('codes the blobs a persist from the RAM tier writes (persist off), and the store restores them', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 8 * 1024 * KiB, pin: false });
    cleanup.push(cache);
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: CHUNK, ram: cache, persist: 'off', codec: 'vsnap-c1' });
    expect(snap.manifest.data.ranks[0]!.regions.every((r) => r.codec === undefined)).toBe(true);
    await snap.persist();
    const stored = await store.get('m');
    expect(stored.data.ranks[0]!.regions.find((r) => r.key === 'bf16.layers.0.weight')!.codec).toBeDefined();
    expect(snap.manifest.toJSON()).toEqual(stored.toJSON());
    const targets = targetsOf(contents);
    await Snapshot.of(store, stored).restore({ regions: targets.map(asTarget) });
    for (const t of targets) expect(t.region.read(0, t.size).equals(contents[t.key]!)).toBe(true);
  });
});
