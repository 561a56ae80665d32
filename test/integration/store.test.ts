import { mkdirSync, readdirSync, readFileSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { acquireLock, tryLock } from '../../src/store/lock.js';
import { RegionStore } from '../../src/store/region-store.js';
import { patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const open: HostRegion[] = [];
afterEach(() => {
  for (const r of open.splice(0)) r.close();
});

function regions(sizes: Record<string, number>) {
  const map = patternedRegions(sizes);
  for (const r of map.values()) open.push(r);
  return [...map].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
}

describe('RegionStore', () => {
  it('stores identical regions once, within and across snapshots', async () => {
    const store = await RegionStore.open(tempDir());
    const a = await Snapshot.capture(store, 'a', { regions: regions({ x: 2 * MiB, y: MiB }) });
    expect(a.lastCapture?.dedupedBytes).toBe(0);
    // same keys: same pattern bytes, so both blobs already exist
    const b = await Snapshot.capture(store, 'b', { regions: regions({ x: 2 * MiB, y: MiB }) });
    expect(b.lastCapture?.dedupedBytes).toBe(3 * MiB);
    expect(await store.usage()).toEqual({ blobs: 2, bytes: 3 * MiB });
    // two regions with the same content inside one capture
    const twin = HostRegion.create(MiB);
    open.push(twin);
    const c = await Snapshot.capture(store, 'c', {
      regions: [
        { key: 'p', size: MiB, memory: twin.memory },
        { key: 'q', size: MiB, memory: twin.memory },
      ],
    });
    expect(c.lastCapture?.dedupedBytes).toBe(MiB);
    expect((await store.usage()).blobs).toBe(3);
  });

  it('a new capture of the same bytes heals a stored blob that rotted', async () => {
    const store = await RegionStore.open(tempDir());
    const first = await Snapshot.capture(store, 'a', { regions: regions({ x: 2 * MiB }) });
    const blob = store.blobPath(first.manifest.data.ranks[0]!.regions[0]!.blob);
    const { chmodSync, openSync, writeSync, closeSync } = await import('node:fs');
    chmodSync(blob, 0o644);
    const fd = openSync(blob, 'r+');
    writeSync(fd, Buffer.from('rot'), 0, 3, 12345);
    closeSync(fd);
    expect((await store.verify('a')).ok).toBe(false);
    const second = await Snapshot.capture(store, 'b', { regions: regions({ x: 2 * MiB }) });
    expect(second.lastCapture?.dedupedBytes).toBe(2 * MiB);
    expect((await store.verify('a')).ok).toBe(true);
  });

  it('keeps history, moves current, removes and collects garbage', async () => {
    const store = await RegionStore.open(tempDir());
    const first = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const second = await Snapshot.capture(store, 'm', { regions: regions({ z: 2 * MiB }) });
    expect((await store.current('m'))?.id).toBe(second.id);
    expect((await store.history('m')).map((h) => h.id)).toEqual([first.id, second.id]);
    expect(await store.list()).toEqual([expect.objectContaining({ name: 'm', id: second.id, bytes: 2 * MiB, versions: 2 })]);

    expect(await store.remove('m', { id: second.id })).toEqual([second.id]);
    expect((await store.current('m'))?.id).toBe(first.id);
    expect(await store.gc()).toEqual({ blobsRemoved: 1, bytesFreed: 2 * MiB });

    await expect(store.get('m', 'nope-0000')).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    expect(await store.remove('m')).toEqual([first.id]);
    expect(await store.current('m')).toBeUndefined();
    await expect(store.get('m')).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    await expect(store.remove('m')).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    expect(await store.gc()).toEqual({ blobsRemoved: 1, bytesFreed: MiB });
    expect(await store.list()).toEqual([]);
  });

  it('parses a manifest again only when its file changed', async () => {
    const dir = tempDir();
    const store = await RegionStore.open(dir);
    const snap = await Snapshot.capture(store, 'a', { regions: regions({ x: 2 * MiB, y: MiB }) });
    const first = await store.current('a');
    expect(first?.id).toBe(snap.id);
    // unchanged: the same parsed manifest (a suspend reads the current one every time)
    expect(await store.current('a')).toBe(first);
    expect(await store.get('a', snap.id)).toBe(first);
    // edited in place, the same size and maybe the same timestamp: read and parsed again
    const path = join(dir, 'snapshots', 'a', `${snap.id}.json`);
    const text = readFileSync(path, 'utf8');
    const edited = text.replace(first!.data.createdAt, '2026-01-01T00:00:00.000Z');
    expect(edited).not.toBe(text);
    writeFileSync(path, edited);
    const again = await store.current('a');
    expect(again).not.toBe(first);
    expect(again?.data.createdAt).toBe('2026-01-01T00:00:00.000Z');
    // damaged: refused, never the manifest parsed before
    writeFileSync(path, edited.replace('"weights"', '"weights'));
    await expect(store.current('a')).rejects.toMatchObject({ code: 'E_MANIFEST_INVALID' });
    // restored, then removed: parsed again, then not found
    writeFileSync(path, text);
    expect((await store.current('a'))?.data.createdAt).toBe(first!.data.createdAt);
    await store.remove('a');
    expect(await store.current('a')).toBeUndefined();
    await expect(store.get('a', snap.id)).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
  });

  it('gc refuses to run past a manifest it cannot read', async () => {
    const dir = tempDir();
    const store = await RegionStore.open(dir);
    await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    mkdirSync(join(dir, 'snapshots', 'broken'));
    writeFileSync(join(dir, 'snapshots', 'broken', '0000000000-aaaaaaaa.json'), '{"schemaVersion":1}');
    await expect(store.gc()).rejects.toMatchObject({ code: 'E_MANIFEST_INVALID' });
    expect((await store.usage()).blobs).toBe(1);
  });

  it('refuses directories that are not stores, and newer formats', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'precious.txt'), 'do not touch');
    await expect(RegionStore.open(dir)).rejects.toMatchObject({ code: 'E_STORE_INVALID' });
    expect(readdirSync(dir)).toEqual(['precious.txt']);

    const newer = tempDir();
    writeFileSync(join(newer, 'vsnap-store.json'), '{"format":2}');
    await expect(RegionStore.open(newer)).rejects.toMatchObject({ code: 'E_STORE_INVALID', message: expect.stringMatching(/Upgrade vsnap/) });
    await expect(RegionStore.open(join(tempDir(), 'absent'), { create: false })).rejects.toMatchObject({ code: 'E_STORE_INVALID' });
    const made = join(tempDir(), 'new', 'store');
    await RegionStore.open(made);
    expect(JSON.parse(readFileSync(join(made, 'vsnap-store.json'), 'utf8'))).toEqual({ format: 1 });
  });

  it('cleans tmp/ of dead writers at open, and leaves live ones alone', async () => {
    const dir = tempDir();
    await RegionStore.open(dir);
    const tmp = join(dir, 'tmp');
    const old = new Date(Date.now() - 3_600_000);
    for (const id of ['dead', 'alive']) {
      mkdirSync(join(tmp, id));
      writeFileSync(join(tmp, id, '0.blob'), 'partial');
      writeFileSync(join(tmp, `${id}.lock`), '');
      utimesSync(join(tmp, `${id}.lock`), old, old);
      utimesSync(join(tmp, id), old, old);
    }
    mkdirSync(join(tmp, 'orphan'));
    utimesSync(join(tmp, 'orphan'), old, old);
    mkdirSync(join(tmp, 'fresh'));
    const release = tryLock(join(tmp, 'alive.lock'), true)!;
    try {
      await RegionStore.open(dir);
      expect(readdirSync(tmp).sort()).toEqual(['alive', 'alive.lock', 'fresh']);
    } finally {
      release();
    }
  });

  it('refuses a capture that cannot fit, before reading anything', async () => {
    const store = await RegionStore.open(tempDir());
    const huge = HostRegion.create(64 * 2 ** 40); // sparse: 64 TiB of nothing
    open.push(huge);
    const err = await Snapshot.capture(store, 'huge', { regions: [{ key: 'w', size: huge.size, memory: huge.memory }] }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_NO_SPACE' });
    expect((err as Error).message).toMatch(/needs up to 65536\.00 GiB/);
    expect(await store.list()).toEqual([]);
  });

  it('waits for the store lock and gives up with E_STORE_LOCKED', async () => {
    const dir = tempDir();
    const store = await RegionStore.open(dir, { lockTimeoutMs: 150 });
    const release = await acquireLock(join(dir, '.lock'), false, 1000);
    try {
      await expect(store.gc()).rejects.toMatchObject({ code: 'E_STORE_LOCKED' });
    } finally {
      release();
    }
    expect(await store.gc()).toEqual({ blobsRemoved: 0, bytesFreed: 0 });
  });

  it('rejects bad names everywhere', async () => {
    const store = await RegionStore.open(tempDir());
    await expect(store.current('../x')).rejects.toMatchObject({ code: 'E_INVALID_NAME' });
    await expect(store.remove('')).rejects.toMatchObject({ code: 'E_INVALID_NAME' });
    await expect(store.get('ok', '../../etc/passwd')).rejects.toMatchObject({ code: 'E_INVALID_NAME' });
    await expect(store.verify('a'.repeat(300))).rejects.toMatchObject({ code: 'E_INVALID_NAME' });
  });
});
