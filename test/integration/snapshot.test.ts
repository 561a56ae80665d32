import { openSync, readdirSync, readSync, statfsSync, truncateSync, writeSync, closeSync, chmodSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import type { TransferProgress } from '../../src/transfer/transfer.js';
import { allBytes, fillRegion, holdsPattern, patternBytes, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const open: HostRegion[] = [];
afterEach(() => {
  for (const r of open.splice(0)) r.close();
});

function regionsOf(map: Map<string, HostRegion>) {
  for (const r of map.values()) open.push(r);
  return [...map].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
}

function blobOf(store: RegionStore, snap: Snapshot, key: string): string {
  const region = [...snap.manifest.regions()].find((r) => r.region.key === key)!.region;
  return store.blobPath(region.blob);
}

/** Flips one byte of a (read-only) blob file. */
function corrupt(path: string, offset: number): void {
  chmodSync(path, 0o644);
  const fd = openSync(path, 'r+');
  const b = Buffer.alloc(1);
  readSync(fd, b, 0, 1, offset);
  b[0] = b[0]! ^ 0xff;
  writeSync(fd, b, 0, 1, offset);
  closeSync(fd);
}

describe('capture and restore through the host backend and a real store', () => {
  it('round-trips regions of awkward sizes byte for byte, with progress', async () => {
    const store = await RegionStore.open(tempDir());
    const sizes = { 'embed.weight': 5 * MiB + 3, 'layers.0.weight': MiB, 'norm.weight': 1, 'anon:0': 0, 'layers.1.weight': 4096 * 3 };
    const captured = patternedRegions(sizes);
    const progress: TransferProgress[] = [];
    const snap = await Snapshot.capture(store, 'model-a', {
      regions: regionsOf(captured),
      chunkSize: 256 * 1024,
      model: { id: 'test/model-a' },
      onProgress: (p) => progress.push(p),
    });
    expect(snap.manifest.totalBytes).toBe(Object.values(sizes).reduce((a, b) => a + b, 0));
    expect(snap.manifest.data.platform.kind).toBe('host');
    expect(snap.manifest.data.ranks[0]!.regions.find((r) => r.key === 'embed.weight')!.checksums).toHaveLength(21);
    expect(progress.at(-1)).toMatchObject({ phase: 'done', bytesDone: snap.manifest.totalBytes, bytesTotal: snap.manifest.totalBytes });

    const targets = patternedRegions(Object.fromEntries(Object.entries(sizes).map(([k, v]) => [k, v])));
    for (const r of targets.values()) fillRegion(r, 0xee);
    const opened = await Snapshot.open(store, 'model-a');
    expect(opened.id).toBe(snap.id);
    const result = await opened.restore({ regions: regionsOf(targets).reverse() });
    expect(result.bytes).toBe(snap.manifest.totalBytes);
    for (const [key, r] of targets) expect(holdsPattern(r, key)).toBe(true);
    expect((await store.verify('model-a')).ok).toBe(true);
  });

  it('handles a region larger than 4 GiB (64-bit offsets, many chunks)', async () => {
    const dir = tempDir();
    const fs = statfsSync(dir);
    const size = 4 * 1024 * MiB + 4096 + 7;
    if (fs.bavail * fs.bsize < size + 2 * 1024 * MiB) {
      throw new Error(`this test needs ${(size / 2 ** 30).toFixed(1)} GiB free in ${dir}`);
    }
    const store = await RegionStore.open(dir);
    const source = HostRegion.create(size, 'big');
    open.push(source);
    const marks = [0, 2 ** 32 - 3, 2 ** 32 + 4096, size - 5];
    for (const at of marks) source.write(at, patternBytes('big', at, 5));
    const snap = await Snapshot.capture(store, 'big', { regions: [{ key: 'big', size, memory: source.memory }] });
    expect(snap.manifest.data.ranks[0]!.regions[0]!.checksums).toHaveLength(Math.ceil(size / (64 * MiB)));
    const target = HostRegion.create(size, 'big-target');
    open.push(target);
    await snap.restore({ regions: [{ key: 'big', size, memory: target.memory }] });
    for (const at of marks) expect(target.read(at, 5).equals(patternBytes('big', at, 5))).toBe(true);
    expect(target.read(2 ** 31, 4096).equals(Buffer.alloc(4096))).toBe(true);
  });

  it('refuses a corrupted blob: the bad chunk never reaches the target, the error names snapshot, region and chunk', async () => {
    const store = await RegionStore.open(tempDir());
    const captured = patternedRegions({ w: 8 * MiB });
    const snap = await Snapshot.capture(store, 'corrupt-me', { regions: regionsOf(captured), chunkSize: MiB });
    corrupt(blobOf(store, snap, 'w'), 5 * MiB + 17);

    const target = HostRegion.create(8 * MiB);
    open.push(target);
    fillRegion(target, 0xab);
    const err = await snap.restore({ regions: [{ key: 'w', size: 8 * MiB, memory: target.memory }], threads: 1 }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_CHECKSUM', details: { snapshot: 'corrupt-me', region: 'w', chunk: 5, offset: 5 * MiB } });
    expect((err as Error).message).toMatch(/snapshot 'corrupt-me', region 'w', chunk 5 of 8/);
    expect(allBytes(target, 0xab, 5 * MiB, MiB)).toBe(true);

    const report = await store.verify('corrupt-me');
    expect(report.ok).toBe(false);
    expect(report.problems).toEqual([expect.objectContaining({ region: 'w', code: 'E_CHECKSUM' })]);
  });

  it("verify: 'all-first' leaves the target untouched when any chunk is corrupt", async () => {
    const store = await RegionStore.open(tempDir());
    const captured = patternedRegions({ a: 4 * MiB, b: 4 * MiB });
    const snap = await Snapshot.capture(store, 's', { regions: regionsOf(captured), chunkSize: MiB });
    corrupt(blobOf(store, snap, 'b'), 3 * MiB + 1);
    const targets = patternedRegions({ a: 4 * MiB, b: 4 * MiB });
    for (const r of targets.values()) fillRegion(r, 0x5a);
    await expect(snap.restore({ regions: regionsOf(targets), verify: 'all-first' })).rejects.toMatchObject({ code: 'E_CHECKSUM' });
    for (const r of targets.values()) expect(allBytes(r, 0x5a)).toBe(true);
  });

  it('refuses a truncated or missing blob before copying anything', async () => {
    const store = await RegionStore.open(tempDir());
    const captured = patternedRegions({ a: 2 * MiB, b: 2 * MiB });
    const snap = await Snapshot.capture(store, 't', { regions: regionsOf(captured), chunkSize: MiB });
    const path = blobOf(store, snap, 'b');
    chmodSync(path, 0o644);
    truncateSync(path, 2 * MiB - 1);
    const targets = patternedRegions({ a: 2 * MiB, b: 2 * MiB });
    for (const r of targets.values()) fillRegion(r, 0x11);
    await expect(snap.restore({ regions: regionsOf(targets) })).rejects.toMatchObject({
      code: 'E_BLOB_TRUNCATED',
      details: { expectedBytes: 2 * MiB, actualBytes: 2 * MiB - 1 },
    });
    for (const r of targets.values()) expect(allBytes(r, 0x11)).toBe(true);

    const { unlinkSync } = await import('node:fs');
    unlinkSync(path);
    await expect(snap.restore({ regions: regionsOf(patternedRegions({ a: 2 * MiB, b: 2 * MiB })) })).rejects.toMatchObject({ code: 'E_BLOB_MISSING' });
    const report = await store.verify('t');
    expect(report.problems.map((p) => p.code)).toEqual(['E_BLOB_MISSING']);
  });

  it('refuses a layout that does not match, listing every difference, and writes nothing', async () => {
    const store = await RegionStore.open(tempDir());
    const snap = await Snapshot.capture(store, 'm', { regions: regionsOf(patternedRegions({ a: MiB, b: MiB })), model: { id: 'x/one' } });
    const targets = patternedRegions({ a: 2 * MiB, c: MiB });
    for (const r of targets.values()) fillRegion(r, 0x22);
    const err = await snap.restore({ regions: regionsOf(targets), live: { model: { id: 'x/two' } } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_MANIFEST_MISMATCH' });
    const kinds = ((err as { details: { mismatches: Array<{ kind: string }> } }).details.mismatches).map((m) => m.kind).sort();
    expect(kinds).toEqual(['field', 'region-missing', 'region-size', 'region-unexpected']);
    for (const r of targets.values()) expect(allBytes(r, 0x22)).toBe(true);
  });

  it('cancels through an AbortSignal and leaves no trace in the store', async () => {
    const dir = tempDir();
    const store = await RegionStore.open(dir);
    const source = HostRegion.create(512 * MiB);
    open.push(source);
    const controller = new AbortController();
    const pending = Snapshot.capture(store, 'cancelled', {
      regions: [{ key: 'w', size: source.size, memory: source.memory }],
      chunkSize: MiB,
      threads: 1,
      signal: controller.signal,
      onProgress: (p) => {
        if (p.bytesDone > 0) controller.abort(new Error('changed my mind'));
      },
    });
    await expect(pending).rejects.toMatchObject({ code: 'E_ABORTED' });
    expect(await store.list()).toEqual([]);
    expect(readdirSync(join(dir, 'tmp'))).toEqual([]);
    await expect(Snapshot.capture(store, 'x', { regions: [{ key: 'w', size: 1, memory: source.memory }], signal: AbortSignal.abort() })).rejects.toMatchObject({
      code: 'E_ABORTED',
    });
  });

  it('rejects bad input with E_INVALID_ARGUMENT', async () => {
    const store = await RegionStore.open(tempDir());
    const r = HostRegion.create(4096);
    open.push(r);
    await expect(Snapshot.capture(store, 'x', { regions: [] })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(
      Snapshot.capture(store, 'x', { regions: [{ key: 'a', size: 4096, memory: r.memory }, { key: 'a', size: 4096, memory: r.memory }] }),
    ).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/unique within rank 0/) });
    await expect(Snapshot.capture(store, 'x', { regions: [{ key: 'a', size: 4096, memory: r.memory }], chunkSize: 1000 })).rejects.toMatchObject({
      code: 'E_INVALID_ARGUMENT',
    });
    await expect(Snapshot.capture(store, 'x', { regions: [{ key: 'a', size: 8192, memory: r.memory }] })).rejects.toMatchObject({
      code: 'E_INVALID_ARGUMENT',
      message: expect.stringMatching(/holds 4096 bytes/),
    });
    await expect(Snapshot.capture(store, '../escape', { regions: [{ key: 'a', size: 4096, memory: r.memory }] })).rejects.toMatchObject({
      code: 'E_INVALID_NAME',
    });
  });

  it('two ranks with the same keys (tensor parallel): captured and restored rank by rank, also through the RAM tier', async () => {
    const store = await RegionStore.open(tempDir());
    const make = (fill: boolean) =>
      [0, 1].flatMap((rank) => {
        const map = patternedRegions({ [`qkv.${rank}`]: 3 * MiB + 17, [`mlp.${rank}`]: MiB });
        return regionsOf(map).map((r) => {
          if (!fill) fillRegion(map.get(r.key)!, 0);
          return { ...r, key: r.key.replace(/\.\d$/, ''), rank, region: map.get(r.key)!, seed: r.key };
        });
      });
    const sources = make(true);
    const snap = await Snapshot.capture(store, 'tp2', { regions: sources, chunkSize: MiB });
    expect(snap.manifest.data.ranks.map((r) => r.regions.map((x) => x.key))).toEqual([['qkv', 'mlp'], ['qkv', 'mlp']]);
    const cache = await RamTier.create({ budgetBytes: 16 * MiB, pin: false });
    try {
      for (const via of [undefined, cache, cache]) {
        const targets = make(false).reverse(); // order does not matter: matched by rank and key
        await snap.restore({ regions: targets, ...(via ? { ram: via } : {}) });
        for (const t of targets) expect(holdsPattern(t.region, t.seed), `${t.rank}/${t.key}`).toBe(true);
      }
    } finally {
      cache.close();
    }
    const missing = make(false).filter((t) => !(t.rank === 1 && t.key === 'mlp'));
    await expect(snap.restore({ regions: missing })).rejects.toMatchObject({ code: 'E_MANIFEST_MISMATCH' });
  });
});
