import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { digestRegions } from '../../src/digest/index.js';
import { native } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { runTransfer } from '../../src/transfer/transfer.js';
import { patternBytes } from '../helpers/regions.js';
import { rejection } from '../helpers/rejection.js';
import { RAM_TIER_SIZES, ramTierFixtures } from '../helpers/ram-tier.js';
import { tempDir } from '../helpers/tmp.js';

// Capture with hash 'deferred' (host-memory backend, real store, real native transfer engine):
// the bytes land in the RAM tier unhashed, the GPU digests (here: the same digest on the CPU)
// vouch for them at every restore, and XXH3 is computed when they are persisted.
const MiB = 1024 * 1024;
const cleanup: Array<{ close(): void }> = [];
afterEach(() => {
  native().setFault('chunk-delay', 0);
  for (const c of cleanup.splice(0)) c.close();
});

const SIZES = RAM_TIER_SIZES;
const { sources, targets, asTargets, intact, cacheOf } = ramTierFixtures(cleanup);
/** Memory mappings of this process backed by a memfd (host regions, mapped by a transfer or digest). */
const memfdMappings = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:')).length;
const blobsIn = (root: string): string[] => readdirSync(join(root, 'blobs'), { recursive: true }).map(String).filter((f) => /^[0-9a-f]{64}$/.test(f.split('/').at(-1)!));

/** Overwrites region `key` of a capture in the RAM tier with its pattern, one byte flipped at `at`. */
async function flipInRam(cache: RamTier, id: string, key: string, size: number, at: number): Promise<void> {
  const lease = cache.hold(id)!;
  const corrupt = HostRegion.create(size);
  cleanup.push(corrupt);
  const bytes = patternBytes(key, 0, size);
  bytes[at]! ^= 0x01;
  corrupt.write(0, bytes);
  try {
    const landed = await runTransfer({
      op: 'capture',
      label: 'flip',
      hash: false,
      regions: [{ name: key, size, chunkSize: MiB, memory: corrupt.memory, hostCopy: { kind: 'buffer', buffer: lease.buffer, offset: lease.offsets.get(`0/${key}`)! } }],
    });
    expect(landed.checksums).toEqual([[]]); // landed unhashed
  } finally {
    lease.release();
  }
}

describe("capture with hash 'deferred'", () => {
  it('is the default for a RAM-tier-only capture: no checksums until persisted, restores from RAM verified by the GPU digests', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    expect(snap.lastCapture?.hash).toBe('deferred');
    expect(snap.manifest.checksummed).toBe(false);
    expect([...snap.manifest.regions()].map(({ region }) => [region.checksums.length, region.blob, region.digests?.length])).toEqual([
      [0, '', 4],
      [0, '', 1],
      [0, '', 0],
    ]);
    const t = targets();
    // verifyDigests: false does not switch off the only check this RAM copy has
    const restored = await snap.restore({ regions: asTargets(t), ram: cache, verifyDigests: false });
    expect(restored.tier).toBe('ram');
    expect(restored.digestSeconds).toBeGreaterThanOrEqual(0);
    expect(intact(t)).toBe(true);
    // nothing to load it from once gone from RAM
    const other = await cacheOf(8 * MiB);
    await expect(snap.restore({ regions: asTargets(targets()), ram: other })).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
    await expect(other.acquire(store, snap.manifest)).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
    expect(other.usedBytes).toBe(0);
  });

  it("persisting computes the same checksums and blobs as a capture hashed 'now': shared in the store, restorable from disk", async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const cache = await cacheOf(16 * MiB);
    const regions = sources();
    const hashed = await Snapshot.capture(store, 'now', { regions, chunkSize: MiB, ram: cache, persist: 'off', hash: 'now' });
    expect(hashed.lastCapture?.hash).toBe('now');
    expect(hashed.manifest.checksummed).toBe(true);
    await hashed.persist();
    const deferred = await Snapshot.capture(store, 'later', { regions, chunkSize: MiB, ram: cache, persist: 'off' });
    const before = blobsIn(root).length;
    await deferred.persist();
    expect(deferred.durable).toBe(true);
    expect(deferred.manifest.checksummed).toBe(true);
    const summary = (s: Snapshot) => [...s.manifest.regions()].map(({ region }) => ({ checksums: region.checksums, blob: region.blob, digests: region.digests }));
    expect(summary(deferred)).toEqual(summary(hashed));
    expect(blobsIn(root).length).toBe(before); // every blob was there already
    const opened = await Snapshot.open(store, 'later');
    expect(opened.id).toBe(deferred.id);
    expect(opened.manifest.data).toEqual(deferred.manifest.data);
    expect((await opened.verify()).problems).toEqual([]);
    const fromDisk = targets();
    expect((await opened.restore({ regions: asTargets(fromDisk) })).tier).toBe('store');
    expect(intact(fromDisk)).toBe(true);
    // a sync capture of the same bytes shares them too
    const sync = await Snapshot.capture(store, 'sync', { regions, chunkSize: MiB });
    expect(summary(sync)).toEqual(summary(hashed));
    expect(sync.lastCapture!.dedupedBytes).toBe(sync.manifest.totalBytes);
  });

  it("persist 'async' defers the hash too and becomes durable in the background", async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'async' });
    expect(snap.lastCapture?.hash).toBe('deferred');
    await snap.persist();
    expect(snap.manifest.checksummed).toBe(true);
    expect((await store.current('m'))?.id).toBe(snap.id);
    expect((await Snapshot.open(store, 'm').then((s) => s.verify())).ok).toBe(true);
  });

  it('a byte flipped in the RAM copy is caught by the restore (nothing left mapped) and by persist (nothing written)', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    await flipInRam(cache, snap.id, 'a', SIZES.a, 2 * MiB + 17);
    const maps = memfdMappings();
    const err = await rejection(snap.restore({ regions: asTargets(targets()), ram: cache, verifyDigests: false }));
    expect(err.code).toBe('E_DIGEST_MISMATCH');
    expect(err.details).toMatchObject({ regions: [{ region: '0/a', chunks: [2] }] });
    expect(memfdMappings()).toBe(maps);

    const failed = await rejection(snap.persist());
    expect(failed.code).toBe('E_CHECKSUM');
    expect(failed.details).toMatchObject({ region: 'a', chunk: 2 });
    expect(snap.durable).toBe(false);
    expect(await store.current('m')).toBeUndefined();
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect(blobsIn(root)).toEqual([]);
  });

  it('a persist cancelled midway leaves nothing in the store, and a retry publishes it whole', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    native().setFault('chunk-delay', 100, 50);
    const abort = new AbortController();
    const persisting = snap.persist({ signal: abort.signal, threads: 1 });
    setTimeout(() => abort.abort(), 30);
    expect((await rejection(persisting)).code).toBe('E_ABORTED');
    native().setFault('chunk-delay', 0);
    expect(snap.durable).toBe(false);
    expect(await store.current('m')).toBeUndefined();
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect(cache.has(snap.id)).toBe(true);
    await snap.persist();
    expect((await Snapshot.open(store, 'm').then((s) => s.verify())).ok).toBe(true);
  });

  it('the native capture without hashing lands in a RAM-tier copy only, never in a blob file', async () => {
    const cache = await cacheOf(8 * MiB);
    const [src] = sources({ a: MiB });
    const reservation = cache.reserve('n', 'native-0000', [{ rank: 0, key: 'a', size: MiB }]);
    try {
      const err = await rejection(
        runTransfer({ op: 'capture', label: 'n', hash: false, regions: [{ name: 'a', size: MiB, chunkSize: MiB, memory: src!.memory, blobPath: join(tempDir(), 'a.blob'), hostCopy: { kind: 'buffer', buffer: reservation.buffer, offset: 0 } }] }),
      );
      expect(err.code).toBe('E_INVALID_ARGUMENT');
    } finally {
      reservation.abandon();
    }
  });

  it("the native capture's digest option: the GPU digest of each chunk from the read that hashes it, equal to a separate digest pass", async () => {
    // A chunk that is not a whole number of the 256 KiB pieces it is read in, and a region whose
    // last chunk ends mid-word: the digest must not depend on how the bytes were split.
    const chunkSize = 3 * 256 * 1024 + 4096;
    const size = 2 * chunkSize + 12_345;
    const src = HostRegion.create(size);
    cleanup.push(src);
    src.write(0, patternBytes('odd', 0, size));
    const blobPath = join(tempDir(), 'odd.blob');
    const fused = await runTransfer({ op: 'capture', label: 'odd', digest: true, regions: [{ name: 'odd', size, chunkSize, memory: src.memory, blobPath }] });
    const alone = await runTransfer({ op: 'capture', label: 'odd', regions: [{ name: 'odd', size, chunkSize, memory: src.memory, blobPath: join(tempDir(), 'odd2.blob') }] });
    const separate = await digestRegions([{ size, chunkSize, memory: src.memory }]);
    expect(fused.digests).toEqual(separate.digests);
    expect(fused.digests![0]).toHaveLength(3);
    expect(fused.checksums).toEqual(alone.checksums); // the XXH3 of pieces is the XXH3 of the chunk
    expect(alone.digests).toBeUndefined();
    const reservation = (await cacheOf(8 * MiB)).reserve('odd', 'odd-0000', [{ rank: 0, key: 'odd', size }]);
    try {
      const hostCopy = { kind: 'buffer' as const, buffer: reservation.buffer, offset: 0 };
      const err = await rejection(runTransfer({ op: 'capture', label: 'odd', hash: false, digest: true, regions: [{ name: 'odd', size, chunkSize, memory: src.memory, hostCopy }] }));
      expect(err.code).toBe('E_INVALID_ARGUMENT'); // digests come with a hashed capture only
    } finally {
      reservation.abandon();
    }
  });

  it('an unpersisted deferred capture is never evicted for room; evicted on purpose, it is gone', async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const snap = await Snapshot.capture(store, 'm', { regions: sources(), chunkSize: MiB, ram: cache, persist: 'off' });
    const other = await Snapshot.capture(store, 'other', { regions: sources({ x: 5 * MiB }), chunkSize: MiB });
    await expect(cache.load(store, other.manifest)).rejects.toMatchObject({ code: 'E_NO_SPACE' });
    cache.clear();
    expect(cache.has(snap.id)).toBe(true);
    expect(cache.evict(snap.id)).toBe(true);
    await expect(snap.persist()).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
    await expect(snap.restore({ regions: asTargets(targets()), ram: cache })).rejects.toMatchObject({ code: 'E_NOT_DURABLE' });
  });

  it("refuses 'deferred' with persist 'sync', and an incremental capture does not share blobs with an unpersisted base", async () => {
    const store = await RegionStore.open(tempDir());
    const cache = await cacheOf(8 * MiB);
    const regions = sources();
    expect((await rejection(Snapshot.capture(store, 'm', { regions, ram: cache, hash: 'deferred' }))).code).toBe('E_INVALID_ARGUMENT');
    // @ts-expect-error: not a mode
    expect((await rejection(Snapshot.capture(store, 'm', { regions, ram: cache, persist: 'off', hash: 'later' }))).code).toBe('E_INVALID_ARGUMENT');
    expect(cache.usedBytes).toBe(0);
    const base = await Snapshot.capture(store, 'm', { regions, chunkSize: MiB, ram: cache, persist: 'off' });
    const next = await Snapshot.capture(store, 'm', { regions, chunkSize: MiB, base });
    expect(next.lastCapture?.reusedBytes).toBe(0);
    expect((await next.verify()).ok).toBe(true);
  });
});

describe('a persist of a deferred capture killed with SIGKILL leaves nothing torn', () => {
  const child = fileURLToPath(new URL('../fixtures/persist-child.mjs', import.meta.url));
  const run = (root: string, failpoint?: string) =>
    new Promise<{ code: number | null; signal: NodeJS.Signals | null; output: string }>((resolve, reject) => {
      const env = { ...process.env, ...(failpoint ? { TEST_FAILPOINTS: failpoint } : {}) };
      const p = spawn(process.execPath, [child, root, 'm'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
      let output = '';
      p.stdout.on('data', (d: Buffer) => (output += d.toString()));
      p.stderr.on('data', (d: Buffer) => (output += d.toString()));
      p.on('error', reject);
      p.on('exit', (code, signal) => resolve({ code, signal, output }));
    });

  it.each(['publish.after-blobs', 'publish.after-manifest'])('killed at %s', async (failpoint) => {
    const root = tempDir();
    const killed = await run(root, failpoint);
    expect(killed.signal).toBe('SIGKILL');
    expect(killed.output).toMatch(/captured deferred/);
    const store = await RegionStore.open(root, { tmpGraceMs: 0 });
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    const id = /captured deferred (\S+)/.exec(killed.output)![1]!;
    expect(await store.current('m')).toBeUndefined();
    if (failpoint === 'publish.after-manifest') {
      // the manifest was in place before the kill: complete (every blob checks), not current
      expect((await Snapshot.open(store, 'm', { id }).then((s) => s.verify())).ok).toBe(true);
    } else {
      await expect(Snapshot.open(store, 'm', { id })).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    }
    const done = await run(root);
    expect(done.code).toBe(0);
    expect(done.output).toMatch(/persisted/);
    expect((await Snapshot.open(store, 'm').then((s) => s.verify())).ok).toBe(true);
  });
});
