import { readFileSync, rmSync, writeFileSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { randomChunk, weights } from '../helpers/codec-data.js';
import { writeHostBuffer } from '../../src/cache/coded-tier.js';
import { RamTier } from '../../src/cache/ram-tier.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { codedOffsets, encodeBlob } from '../../src/store/coded-blob.js';
import type { CodecKind } from '../../src/transfer/codec.js';
import { native, type NativeHostBuffer } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { allBytes, fillRegion } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c.close();
});

/** Regions holding `contents`, BF16 where the name says so (the manifest's dtype hint). */
function regionsOf(contents: Record<string, Buffer>) {
  return Object.entries(contents).map(([key, bytes]) => {
    const r = HostRegion.create(bytes.length);
    cleanup.push(r);
    r.write(0, bytes);
    const tensors = key.startsWith('bf16') ? [{ name: key, offset: 0, dtype: 'torch.bfloat16', shape: [bytes.length / 2] }] : [];
    return { key, size: bytes.length, memory: r.memory, tensors };
  });
}

function targetsOf(contents: Record<string, Buffer>) {
  return Object.entries(contents).map(([key, bytes]) => {
    const r = HostRegion.create(bytes.length);
    cleanup.push(r);
    fillRegion(r, 0xa5);
    return { key, size: bytes.length, memory: r.memory, region: r };
  });
}

const asTarget = ({ key, size, memory }: { key: string; size: number; memory: HostRegion['memory'] }) => ({ key, size, memory });

async function cacheOf(codec: 'vsnap-c1' | 'off', budgetBytes = 32 * MiB): Promise<RamTier> {
  const cache = await RamTier.create({ budgetBytes, pin: false, codec });
  cleanup.push(cache);
  return cache;
}

/** The RAM tier's place of a region's chunk (internal, read through a lease). */
async function heldChunk(cache: RamTier, store: RegionStore, manifest: Manifest, key: string, chunk: number) {
  const lease = await cache.acquire(store, manifest);
  try {
    return { buffer: lease.buffer, place: lease.chunks!.get(`0/${key}`)![chunk]! };
  } finally {
    lease.release();
  }
}

const gaussian = (size: number, seed = 1) => weights('bf16', 'gaussian', size, seed);

/**
 * A snapshot of `contents` whose regions are stored as `forms` says: coded with that hint (the
 * chunks that do not shrink stored in raw mode), or `raw` (no codec). Published through a capture
 * transaction as RegionStore does.
 */
async function storedSnapshot(store: RegionStore, name: string, contents: Record<string, Buffer>, forms: Record<string, CodecKind | 'raw'>): Promise<Snapshot> {
  const plain = await Snapshot.capture(store, `${name}-raw`, { regions: regionsOf(contents), chunkSize: MiB });
  const total = Object.values(contents).reduce((n, b) => n + b.length, 0);
  const txn = await store.beginCapture(name, total);
  const regions = plain.manifest.data.ranks[0]!.regions.map((r, i) => {
    const form = forms[r.key]!;
    if (form === 'raw') {
      writeFileSync(txn.blobTmpPath(i), contents[r.key]!);
      return { region: r, size: r.size };
    }
    const coded = encodeBlob(contents[r.key]!, r.chunkSize, r.checksums, form);
    writeFileSync(txn.blobTmpPath(i), coded.bytes);
    return { region: { ...r, blob: coded.digest, codec: coded.codec }, size: coded.bytes.length };
  });
  const manifest = Manifest.parse({ ...plain.manifest.data, id: txn.id, name, ranks: [{ ...plain.manifest.data.ranks[0]!, regions: regions.map((x) => x.region) }] });
  await txn.publish(manifest, regions.map((x, i) => ({ tmpPath: txn.blobTmpPath(i), digest: x.region.blob, size: x.size })));
  return Snapshot.open(store, name);
}

/** The bytes a region's blob stores for chunk `i`. */
function blobChunk(store: RegionStore, snap: Snapshot, key: string, i: number): Buffer {
  const region = snap.manifest.data.ranks[0]!.regions.find((r) => r.key === key)!;
  const at = codedOffsets(region.codec!);
  return readFileSync(store.blobPath(region.blob)).subarray(at[i]!, at[i + 1]!);
}

describe('RamTier holding coded chunks (codec vsnap-c1)', () => {
  it('a capture lands coded: fewer bytes held than raw for BF16 Gaussian weights, restored bit-exact', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.a': gaussian(3 * MiB, 1), 'bf16.b': gaussian(2 * MiB + 4096, 2) };
    const cache = await cacheOf('vsnap-c1');
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(contents), chunkSize: MiB, ram: cache });
    const raw = 5 * MiB + 4096;
    expect(cache.usedBytes).toBeLessThan(raw * 0.72);
    expect(cache.entries[0]!.bytes).toBeLessThan(raw * 0.72);

    const t = targetsOf(contents);
    const r = await snap.restore({ regions: t.map(asTarget), ram: cache });
    expect(r.tier).toBe('ram');
    for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
  });

  it('random bytes stay raw (no header) and restore; regions coded and raw mix in one snapshot', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.w': gaussian(2 * MiB), noise: randomChunk(MiB + 12345, 7), zeros: Buffer.alloc(MiB) };
    const cache = await cacheOf('vsnap-c1');
    const snap = await Snapshot.capture(store, 'mixed', { regions: regionsOf(contents), chunkSize: MiB, ram: cache });
    const noise = await heldChunk(cache, store, snap.manifest, 'noise', 0);
    expect(noise.place).toMatchObject({ coded: false, held: MiB, rawSize: MiB });
    expect((await heldChunk(cache, store, snap.manifest, 'zeros', 0)).place.coded).toBe(true);
    expect((await heldChunk(cache, store, snap.manifest, 'bf16.w', 1)).place.coded).toBe(true);
    const t = targetsOf(contents);
    await snap.restore({ regions: t.map(asTarget), ram: cache });
    for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
  });

  it('loading from the store codes the snapshot too; an old manifest restores as before without the codec', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.a': gaussian(2 * MiB) };
    const snap = await Snapshot.capture(store, 'plain', { regions: regionsOf(contents), chunkSize: MiB });
    expect(snap.manifest.data.ranks[0]!.regions[0]!.codec).toBeUndefined();

    const off = await cacheOf('off');
    const t1 = targetsOf(contents);
    await snap.restore({ regions: t1.map(asTarget), ram: off });
    expect(off.usedBytes).toBe(2 * MiB);
    expect(t1[0]!.region.read(0, 2 * MiB).equals(contents['bf16.a'])).toBe(true);

    const coded = await cacheOf('vsnap-c1');
    const t2 = targetsOf(contents);
    expect((await snap.restore({ regions: t2.map(asTarget), ram: coded })).tier).toBe('store');
    expect(coded.usedBytes).toBeLessThan(2 * MiB * 0.72);
    const t3 = targetsOf(contents);
    expect((await snap.restore({ regions: t3.map(asTarget), ram: coded })).tier).toBe('ram');
    for (const t of [t2, t3]) expect(t[0]!.region.read(0, 2 * MiB).equals(contents['bf16.a'])).toBe(true);
  });

  it('a damaged coded chunk in the RAM tier: the restore refuses naming region and chunk, no target byte written', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.a': gaussian(2 * MiB), 'bf16.b': gaussian(2 * MiB, 3) };
    const cache = await cacheOf('vsnap-c1');
    const snap = await Snapshot.capture(store, 'bad', { regions: regionsOf(contents), chunkSize: MiB, ram: cache });
    const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.b', 1);
    await writeHostBuffer(buffer, place.at, Buffer.from('XXXX')); // the magic
    const t = targetsOf(contents);
    await expect(snap.restore({ regions: t.map(asTarget), ram: cache })).rejects.toMatchObject({
      code: 'E_CODEC_CORRUPT',
      details: expect.objectContaining({ region: 'bf16.b', chunk: 1, snapshot: 'bad' }),
    });
    for (const x of t) expect(allBytes(x.region, 0xa5)).toBe(true);
  });

  it('a coded chunk damaged where its structure still holds (a mantissa byte): E_CHECKSUM before any byte is written', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.a': gaussian(2 * MiB), 'bf16.b': gaussian(2 * MiB, 3) };
    const cache = await cacheOf('vsnap-c1');
    const snap = await Snapshot.capture(store, 'flip', { regions: regionsOf(contents), chunkSize: MiB, ram: cache });
    const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.b', 1);
    // The rest plane (sign and mantissa, kept verbatim) ends before the exceptions: a byte in the middle of the chunk is in it.
    const at = place.at + Math.floor(place.held * 0.6);
    const was = buffer.read(at, 1)[0]!;
    await writeHostBuffer(buffer, at, Buffer.from([was ^ 0x01]));
    const t = targetsOf(contents);
    await expect(snap.restore({ regions: t.map(asTarget), ram: cache })).rejects.toMatchObject({ code: 'E_CHECKSUM' });
    for (const x of t) expect(allBytes(x.region, 0xa5)).toBe(true);
  });

  it('a RAM-tier-only capture (persist off) is held coded, as the CPU encoder writes each chunk; persist decodes it to raw blobs', async () => {
    for (const hash of ['now', 'deferred'] as const) {
      const store = await RegionStore.open(tempDir());
      const contents = { 'bf16.a': gaussian(2 * MiB + 4096), noise: randomChunk(MiB, 3) };
      const cache = await cacheOf('vsnap-c1');
      const snap = await Snapshot.capture(store, 'later', { regions: regionsOf(contents), chunkSize: MiB, ram: cache, persist: 'off', hash });
      expect(snap.manifest.checksummed).toBe(hash === 'now');
      expect(cache.usedBytes).toBeLessThan(3 * MiB + 4096 - MiB / 2); // the BF16 region in about 0.7 of its bytes
      for (const i of [0, 1, 2]) {
        const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.a', i);
        const raw = contents['bf16.a'].subarray(i * MiB, (i + 1) * MiB);
        expect(place.coded).toBe(true);
        expect(buffer.read(place.at, place.held).equals(native().codecEncode(raw, 2))).toBe(true);
      }
      await snap.persist();
      expect(snap.manifest.checksummed).toBe(true);
      // from the store alone: its blobs hold the raw bytes
      const t = targetsOf(contents);
      await (await Snapshot.open(store, 'later')).restore({ regions: t.map(asTarget) });
      for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
      const again = targetsOf(contents);
      await snap.restore({ regions: again.map(asTarget), ram: cache });
      for (const x of again) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
    }
  });

  it('a RAM-tier-only coded capture whose hash was deferred (no checksums yet) restores from the RAM tier bit-exact; a damaged mantissa byte fails its digest', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.a': gaussian(2 * MiB + 4096, 7), noise: randomChunk(MiB, 8) };
    const cache = await cacheOf('vsnap-c1');
    const snap = await Snapshot.capture(store, 'later', { regions: regionsOf(contents), chunkSize: MiB, ram: cache, persist: 'off', hash: 'deferred' });
    expect(snap.manifest.checksummed).toBe(false);
    const t = targetsOf(contents);
    const r = await snap.restore({ regions: t.map(asTarget), ram: cache, verifyDigests: false });
    expect(r.tier).toBe('ram');
    expect(r.digestSeconds).toBeDefined(); // the digest is the check of a capture without checksums, whatever verifyDigests says
    for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);

    const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.a', 1);
    const mid = place.at + Math.floor(place.held * 0.6); // a rest (mantissa) byte: the structure still holds
    const was = buffer.read(mid, 1)[0]!;
    await writeHostBuffer(buffer, mid, Buffer.from([was ^ 0x01]));
    await expect(snap.restore({ regions: targetsOf(contents).map(asTarget), ram: cache })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH' });
  });

  it('a RAM-tier-only coded capture damaged before persist: persist refuses and writes nothing', async () => {
    for (const hash of ['now', 'deferred'] as const) {
      const store = await RegionStore.open(tempDir());
      const contents = { 'bf16.a': gaussian(2 * MiB) };
      const cache = await cacheOf('vsnap-c1');
      const snap = await Snapshot.capture(store, 'later', { regions: regionsOf(contents), chunkSize: MiB, ram: cache, persist: 'off', hash });
      const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.a', 1);
      const mid = place.at + Math.floor(place.held * 0.6); // a rest (mantissa) byte: the structure still holds
      const was = buffer.read(mid, 1)[0]!;
      await writeHostBuffer(buffer, mid, Buffer.from([was ^ 0x01]));
      await expect(snap.persist()).rejects.toMatchObject({ code: 'E_CHECKSUM', details: { region: 'bf16.a', chunk: 1 } });
      await expect(Snapshot.open(store, 'later')).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
      await writeHostBuffer(buffer, place.at, Buffer.from('XXXX'));
      await expect(snap.persist()).rejects.toMatchObject({ code: 'E_CODEC_CORRUPT', details: { region: 'bf16.a', chunk: 1 } });
    }
  });

  it('a snapshot whose store blobs are coded loads into the RAM tier (coded or raw) verified, and restores; a damaged coded blob is refused at load', async () => {
    const store = await RegionStore.open(tempDir());
    const contents = { 'bf16.a': gaussian(2 * MiB + 4096), noise: randomChunk(MiB, 5) };
    const plain = await Snapshot.capture(store, 'src', { regions: regionsOf(contents), chunkSize: MiB });
    // The same capture with coded blobs, published through a capture transaction as RegionStore does.
    const txn = await store.beginCapture('cb', 4 * MiB);
    const regions = plain.manifest.data.ranks[0]!.regions.map((r, i) => {
      const coded = encodeBlob(contents[r.key as keyof typeof contents], r.chunkSize, r.checksums, r.key.startsWith('bf16') ? 'bf16' : 'bytes');
      writeFileSync(txn.blobTmpPath(i), coded.bytes);
      return { region: { ...r, blob: coded.digest, codec: coded.codec }, size: coded.bytes.length };
    });
    const manifest = Manifest.parse({ ...plain.manifest.data, id: txn.id, name: 'cb', ranks: [{ ...plain.manifest.data.ranks[0]!, regions: regions.map((x) => x.region) }] });
    await txn.publish(manifest, regions.map((x, i) => ({ tmpPath: txn.blobTmpPath(i), digest: x.region.blob, size: x.size })));
    const snap = await Snapshot.open(store, 'cb');
    expect(snap.manifest.data.ranks[0]!.regions[0]!.codec?.name).toBe('vsnap-c1');

    for (const codec of ['vsnap-c1', 'off'] as const) {
      const cache = await cacheOf(codec);
      await cache.load(store, snap.manifest);
      if (codec === 'vsnap-c1') expect(cache.usedBytes).toBeLessThan(3 * MiB + 4096);
      else expect(cache.usedBytes).toBe(3 * MiB + 4096);
      const t = targetsOf(contents);
      expect((await snap.restore({ regions: t.map(asTarget), ram: cache })).tier).toBe('ram');
      for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
    }

    const path = store.blobPath(snap.manifest.data.ranks[0]!.regions[0]!.blob);
    const bytes = readFileSync(path);
    bytes[bytes.length - 100]! ^= 0x01; // the last chunk's exceptions or rest bits: decodes, fails its checksum, or is refused
    rmSync(path);
    writeFileSync(path, bytes);
    const cache = await cacheOf('vsnap-c1');
    const t = targetsOf(contents);
    await expect(snap.restore({ regions: t.map(asTarget), ram: cache })).rejects.toMatchObject({ code: expect.stringMatching(/^E_(CHECKSUM|CODEC_CORRUPT)$/), details: expect.objectContaining({ region: 'bf16.a', chunk: 2 }) });
    expect(cache.has(snap.id)).toBe(false);
    expect(cache.usedBytes).toBe(0);
    for (const x of t) expect(allBytes(x.region, 0xa5)).toBe(true);
  });

  it('coded store blobs load into a coded RAM tier as they are stored: the chunks held are the blob\'s (not coded again), raw-mode chunks held raw, raw blobs coded; restored bit-exact', async () => {
    const store = await RegionStore.open(tempDir());
    // 'bf16.a' coded as bytes (not the tier's bf16 hint: a second encode would hold other bytes);
    // 'mix' coded with a chunk that does not shrink (stored in raw mode); 'zeros' and 'noise' raw blobs.
    const contents = { 'bf16.a': gaussian(2 * MiB + 4096, 1), mix: Buffer.concat([gaussian(MiB, 2), randomChunk(MiB, 4)]), zeros: Buffer.alloc(MiB), noise: randomChunk(MiB + 100, 5) };
    const snap = await storedSnapshot(store, 'cb', contents, { 'bf16.a': 'bytes', mix: 'bf16', zeros: 'raw', noise: 'raw' });
    const cache = await cacheOf('vsnap-c1');
    await cache.load(store, snap.manifest);
    expect(cache.has(snap.id)).toBe(true);

    for (const i of [0, 1, 2]) {
      const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.a', i);
      const stored = blobChunk(store, snap, 'bf16.a', i);
      expect(place).toMatchObject({ coded: true, held: stored.length });
      expect(buffer.read(place.at, place.held).equals(stored)).toBe(true);
      expect(stored.equals(native().codecEncode(contents['bf16.a'].subarray(i * MiB, (i + 1) * MiB), 2))).toBe(false); // what codeInPlace would hold
      expect(place.at % 16).toBe(0);
    }
    const mixCoded = await heldChunk(cache, store, snap.manifest, 'mix', 0);
    expect(mixCoded.buffer.read(mixCoded.place.at, mixCoded.place.held).equals(blobChunk(store, snap, 'mix', 0))).toBe(true);
    const mixRaw = await heldChunk(cache, store, snap.manifest, 'mix', 1);
    expect(blobChunk(store, snap, 'mix', 1).length).toBe(MiB + 64); // stored in raw mode, behind its header
    expect(mixRaw.place).toMatchObject({ coded: false, held: MiB, rawSize: MiB });
    expect(mixRaw.buffer.read(mixRaw.place.at, MiB).equals(contents.mix.subarray(MiB))).toBe(true);
    expect((await heldChunk(cache, store, snap.manifest, 'zeros', 0)).place.coded).toBe(true); // a raw blob is coded here, as before
    expect((await heldChunk(cache, store, snap.manifest, 'noise', 1)).place).toMatchObject({ coded: false, held: 100 });
    const storedTotal = snap.manifest.storedBytes;
    expect(cache.usedBytes).toBeLessThan(storedTotal); // zeros coded, raw-mode headers dropped

    const t = targetsOf(contents);
    expect((await snap.restore({ regions: t.map(asTarget), ram: cache })).tier).toBe('ram');
    for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
  });

  it('a damaged chunk of a coded store blob: the load refuses naming region and chunk, nothing is held and the budget is untouched', async () => {
    const contents = { 'bf16.a': gaussian(2 * MiB, 1), 'bf16.b': gaussian(2 * MiB, 3) };
    // A rest (mantissa) byte in the middle of chunk 1: its structure holds, its checksum fails; then its magic.
    for (const [where, code] of [['rest', 'E_CHECKSUM'], ['magic', 'E_CODEC_CORRUPT']] as const) {
      const store = await RegionStore.open(tempDir());
      const snap = await storedSnapshot(store, 'bad', contents, { 'bf16.a': 'bf16', 'bf16.b': 'bf16' });
      const region = snap.manifest.data.ranks[0]!.regions[1]!;
      const path = store.blobPath(region.blob);
      const bytes = readFileSync(path);
      const [start, end] = codedOffsets(region.codec!).slice(1, 3) as [number, number];
      bytes[where === 'magic' ? start : start + Math.floor((end - start) * 0.6)]! ^= 0x01;
      rmSync(path);
      writeFileSync(path, bytes);
      const cache = await cacheOf('vsnap-c1');
      await expect(cache.load(store, snap.manifest)).rejects.toMatchObject({ code, details: expect.objectContaining({ region: 'bf16.b', chunk: 1 }) });
      expect(cache.has(snap.id)).toBe(false);
      expect(cache.usedBytes).toBe(0);
      expect(cache.entries).toEqual([]);
      const t = targetsOf(contents);
      await expect(snap.restore({ regions: t.map(asTarget), ram: cache })).rejects.toMatchObject({ code });
      for (const x of t) expect(allBytes(x.region, 0xa5)).toBe(true);
      expect(cache.usedBytes).toBe(0);
    }
  });

  it('a capture held coded persists into coded blobs as it is held, not encoded again (hash now and deferred); the store restores it and verify passes', async () => {
    for (const hash of ['now', 'deferred'] as const) {
      const store = await RegionStore.open(tempDir());
      const cache = await cacheOf('vsnap-c1');
      // 'plain' has no dtype (held coded as bytes); 'bf16.mix' has a chunk that does not shrink; 'noise' none.
      const contents = { plain: gaussian(2 * MiB, 6), 'bf16.mix': Buffer.concat([gaussian(MiB, 7), randomChunk(MiB, 8)]), noise: randomChunk(MiB, 9) };
      const snap = await Snapshot.capture(store, 'p', { regions: regionsOf(contents), chunkSize: MiB, ram: cache, persist: 'off', hash, codec: 'vsnap-c1' });
      // Chunk 0 of 'plain' held as another valid coding of its bytes (bf16: smaller): an encode at persist would store the bytes coding.
      const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'plain', 0);
      const other = native().codecEncode(contents.plain.subarray(0, MiB), 2);
      expect(other.length).toBeLessThan(place.held);
      await writeHostBuffer(buffer, place.at, other);
      (place as { held: number }).held = other.length;

      await snap.persist();
      const stored = await Snapshot.open(store, 'p');
      expect(stored.manifest.toJSON()).toEqual(snap.manifest.toJSON());
      expect(blobChunk(store, stored, 'plain', 0).equals(other)).toBe(true);
      const plain1 = await heldChunk(cache, store, snap.manifest, 'plain', 1);
      expect(blobChunk(store, stored, 'plain', 1).equals(plain1.buffer.read(plain1.place.at, plain1.place.held))).toBe(true);
      expect(blobChunk(store, stored, 'bf16.mix', 1).equals(native().codecEncode(contents['bf16.mix'].subarray(MiB), 2))).toBe(true); // raw mode, as the encoder writes it
      const noise = stored.manifest.data.ranks[0]!.regions.find((r) => r.key === 'noise')!;
      expect(noise.codec).toBeUndefined(); // nothing shrank: a raw blob, shared with raw captures of the same bytes
      expect(readFileSync(store.blobPath(noise.blob)).equals(contents.noise)).toBe(true);
      expect((await store.verify('p')).ok).toBe(true);
      const t = targetsOf(contents);
      await stored.restore({ regions: t.map(asTarget) });
      for (const x of t) expect(x.region.read(0, x.size).equals(contents[x.key as keyof typeof contents])).toBe(true);
    }
  });

  it('a capture held coded, damaged before a persist into coded blobs: refused naming region and chunk, nothing published', async () => {
    for (const hash of ['now', 'deferred'] as const) {
      const store = await RegionStore.open(tempDir());
      const cache = await cacheOf('vsnap-c1');
      const snap = await Snapshot.capture(store, 'p', { regions: regionsOf({ 'bf16.a': gaussian(2 * MiB) }), chunkSize: MiB, ram: cache, persist: 'off', hash, codec: 'vsnap-c1' });
      const { buffer, place } = await heldChunk(cache, store, snap.manifest, 'bf16.a', 1);
      const mid = place.at + Math.floor(place.held * 0.6); // a rest (mantissa) byte: the structure still holds
      await writeHostBuffer(buffer, mid, Buffer.from([buffer.read(mid, 1)[0]! ^ 0x01]));
      await expect(snap.persist()).rejects.toMatchObject({ code: 'E_CHECKSUM', details: { region: 'bf16.a', chunk: 1 } });
      await expect(Snapshot.open(store, 'p')).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
      await writeHostBuffer(buffer, place.at, Buffer.from('XXXX'));
      await expect(snap.persist()).rejects.toMatchObject({ code: 'E_CODEC_CORRUPT', details: { region: 'bf16.a', chunk: 1 } });
      expect((await store.usage()).blobs).toBe(0);
    }
  });

  it('the GPU restore of held chunks takes device memory only, and checks the chunks against the buffer before anything is opened', async () => {
    const cache = await cacheOf('vsnap-c1', MiB);
    const target = HostRegion.create(MiB);
    cleanup.push(target);
    const source = { kind: 'buffer' as const, buffer: (cache as unknown as { buffer: NativeHostBuffer }).buffer, offset: 0 };
    const chunks = new Float64Array([0, 1024, 1024, 0, 0]);
    await expect(native().codecRestoreHeld(source, [{ memory: { kind: 'host', fd: target.fd }, size: MiB, chunks }])).rejects.toMatchObject({
      code: 'E_INVALID_ARGUMENT',
      message: expect.stringContaining('not device memory'),
    });
    expect(() => native().codecRestoreHeld(source, [{ memory: { kind: 'host', fd: target.fd }, size: MiB, chunks: new Float64Array([MiB - 8, 64, 64, 0, 1]) }])).toThrow(/outside the HostBuffer/);
  });

  it('the GPU capture into held chunks takes device memory only, and its room inside the buffer', async () => {
    const cache = await cacheOf('vsnap-c1', MiB);
    const source = HostRegion.create(MiB);
    cleanup.push(source);
    const dest = { kind: 'buffer' as const, buffer: (cache as unknown as { buffer: NativeHostBuffer }).buffer, offset: 0 };
    const sources = [{ memory: { kind: 'host' as const, fd: source.fd }, size: MiB, chunkSize: MiB, kind: 2 }];
    await expect(native().codecCaptureHeld(dest, MiB, sources)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringContaining('not device memory') });
    expect(() => native().codecCaptureHeld(dest, MiB + 1, sources)).toThrow(/inside the HostBuffer/);
    expect(() => native().codecCaptureHeld({ ...dest, offset: 4096 }, 0, sources)).toThrow(/inside the HostBuffer/);
    expect(() => native().codecCaptureHeld(dest, MiB, [{ ...sources[0]!, kind: 7 }])).toThrow(/kind must be 0..6/);
  });

  it('rejects an unknown codec and unknown options', async () => {
    await expect(RamTier.create({ budgetBytes: MiB, pin: false, codec: 'zstd' as never })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(RamTier.create({ budgetBytes: MiB, pin: false, codecs: 'x' } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});
