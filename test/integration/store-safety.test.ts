// The store never reaches outside its root, orders captures without the wall clock, survives
// stray files, and lets publishes through while readers hold the blob lock (issue 12).
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it, vi } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { acquireLock } from '../../src/store/lock.js';
import { RegionStore } from '../../src/store/region-store.js';
import { patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const open: HostRegion[] = [];
afterEach(() => {
  for (const r of open.splice(0)) r.close();
  vi.restoreAllMocks();
});

function regions(sizes: Record<string, number>) {
  const map = patternedRegions(sizes);
  for (const r of map.values()) open.push(r);
  return [...map].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
}

/** A directory outside the store with a file that must survive. */
function outside(): { dir: string; file: string } {
  const dir = tempDir('vsnap-outside-');
  const file = join(dir, 'precious');
  writeFileSync(file, 'keep me');
  return { dir, file };
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(VsnapError);
  return (err as VsnapError).code;
}

describe('the store never follows a link inside its root', () => {
  it('a linked tmp/ is refused at open; nothing outside is cleaned', async () => {
    const root = tempDir();
    await RegionStore.open(root);
    const out = outside();
    writeFileSync(join(out.dir, 'old.lock'), '');
    rmSync(join(root, 'tmp'), { recursive: true });
    symlinkSync(out.dir, join(root, 'tmp'));
    expect(await codeOf(RegionStore.open(root, { tmpGraceMs: 0 }))).toBe('E_STORE_UNSAFE');
    expect(readdirSync(out.dir).sort()).toEqual(['old.lock', 'precious']);
  });

  it('links to entries of tmp/ are removed as links, their targets untouched', async () => {
    const root = tempDir();
    await RegionStore.open(root);
    const out = outside();
    symlinkSync(out.dir, join(root, 'tmp', 'deadbeef'));
    symlinkSync(out.file, join(root, 'tmp', 'other.lock'));
    await RegionStore.open(root, { tmpGraceMs: -1 });
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect(readFileSync(out.file, 'utf8')).toBe('keep me');
  });

  it('a linked blobs/xx: gc and usage refuse, restores and verifies refuse, nothing outside is deleted', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const snap = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const blob = snap.manifest.data.ranks[0]!.regions[0]!.blob;
    const prefix = join(root, 'blobs', blob.slice(0, 2));
    const out = outside();
    // the prefix directory is moved out and linked back: its blob stays readable through the link
    renameSync(prefix, join(out.dir, 'moved'));
    symlinkSync(join(out.dir, 'moved'), prefix);
    writeFileSync(join(out.dir, 'moved', `${blob.slice(0, 2)}${'0'.repeat(62)}`), 'an outside file gc would delete');
    expect(await codeOf(store.gc())).toBe('E_STORE_UNSAFE');
    expect(await codeOf(store.usage())).toBe('E_STORE_UNSAFE');
    const report = await store.verify('m');
    expect(report.ok).toBe(false);
    expect(report.problems.map((p) => p.code)).toEqual(['E_STORE_UNSAFE']);
    const target = HostRegion.create(MiB);
    open.push(target);
    expect(await codeOf(snap.restore({ regions: [{ key: 'x', size: MiB, memory: target.memory }] }))).toBe('E_STORE_UNSAFE');
    expect(await codeOf(Snapshot.capture(store, 'n', { regions: regions({ x: MiB }) }))).toBe('E_STORE_UNSAFE');
    expect(readdirSync(join(out.dir, 'moved'))).toHaveLength(2);
  });

  it('a blob that is a link is refused, not read', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const snap = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const path = store.blobPath(snap.manifest.data.ranks[0]!.regions[0]!.blob);
    const out = outside();
    renameSync(path, join(out.dir, 'blob'));
    symlinkSync(join(out.dir, 'blob'), path);
    expect((await store.verify('m')).problems.map((p) => p.code)).toEqual(['E_STORE_UNSAFE']);
  });

  it('a linked snapshots/<name>: remove and capture refuse, list reports it beside healthy snapshots', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    await Snapshot.capture(store, 'good', { regions: regions({ x: MiB }) });
    await Snapshot.capture(store, 'm', { regions: regions({ y: MiB }) });
    const out = outside();
    const dir = join(root, 'snapshots', 'm');
    for (const f of readdirSync(dir)) renameSync(join(dir, f), join(out.dir, f));
    rmSync(dir, { recursive: true });
    symlinkSync(out.dir, dir);
    const before = readdirSync(out.dir).sort();
    expect(await codeOf(store.remove('m'))).toBe('E_STORE_UNSAFE');
    expect(await codeOf(Snapshot.capture(store, 'm', { regions: regions({ y: MiB }) }))).toBe('E_STORE_UNSAFE');
    expect(await codeOf(store.get('m'))).toBe('E_STORE_UNSAFE');
    expect(await codeOf(store.gc())).toBe('E_STORE_UNSAFE');
    const list = await store.list();
    expect(list.map((s) => s.name)).toEqual(['good']);
    expect(list.problems).toEqual([{ name: 'm', code: 'E_STORE_UNSAFE', message: expect.stringMatching(/symbolic link/) }]);
    expect(readdirSync(out.dir).sort()).toEqual(before);
  });

  it('a linked .lock or .meta.lock is refused; its target is never created', async () => {
    for (const lock of ['.lock', '.meta.lock']) {
      const root = tempDir();
      await RegionStore.open(root);
      const out = outside();
      rmSync(join(root, lock), { force: true });
      symlinkSync(join(out.dir, 'created'), join(root, lock));
      expect(await codeOf(RegionStore.open(root))).toBe('E_STORE_UNSAFE');
      expect(existsSync(join(out.dir, 'created'))).toBe(false);
    }
  });

  it('`current` is validated: junk is never used as a path, a link is not read', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const snap = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const current = join(root, 'snapshots', 'm', 'current');
    const out = outside();
    writeFileSync(join(out.dir, 'x.json'), JSON.stringify(snap.manifest.toJSON()));
    writeFileSync(current, '../../../../../../../../../..' + join(out.dir, 'x') + '\n');
    expect(await codeOf(store.get('m'))).toBe('E_STORE_INVALID');
    expect((await store.list()).problems.map((p) => p.code)).toEqual(['E_STORE_INVALID']);
    rmSync(current);
    symlinkSync(join(out.dir, 'x.json'), current);
    expect(await codeOf(store.get('m'))).toBe('E_STORE_UNSAFE');
    // a manifest that is a link is not read either
    rmSync(current);
    writeFileSync(current, `${snap.id}\n`);
    const manifest = join(root, 'snapshots', 'm', `${snap.id}.json`);
    rmSync(manifest);
    symlinkSync(join(out.dir, 'x.json'), manifest);
    expect(await codeOf(store.get('m'))).toBe('E_STORE_UNSAFE');
  });
});

describe('stray files and bad manifests', () => {
  it('never make gc, usage or list throw raw errors; one bad manifest hides no healthy snapshot', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const good = await Snapshot.capture(store, 'good', { regions: regions({ x: MiB }) });
    await Snapshot.capture(store, 'bad', { regions: regions({ y: MiB }) });
    writeFileSync(join(root, 'blobs', 'stray'), 'x');
    const prefix = good.manifest.data.ranks[0]!.regions[0]!.blob.slice(0, 2);
    writeFileSync(join(root, 'blobs', prefix, 'stray-too'), 'x');
    mkdirSync(join(root, 'blobs', prefix, 'a-directory'));
    writeFileSync(join(root, 'snapshots', 'stray-file'), 'x');
    writeFileSync(join(root, 'snapshots', 'good', 'notes.txt'), 'x');
    const badId = (await store.current('bad'))!.id;
    writeFileSync(join(root, 'snapshots', 'bad', `${badId}.json`), '{"schemaVersion":1}');

    expect(await store.usage()).toEqual({ blobs: 2, bytes: 2 * MiB });
    const list = await store.list();
    expect(list.map((s) => s.name)).toEqual(['good']);
    expect(list.problems.map((p) => `${p.name} ${p.code}`)).toEqual(['bad E_MANIFEST_INVALID', 'stray-file E_STORE_INVALID']);
    // gc refuses past the unreadable manifest (it may reference blobs), with a coded error
    expect(await codeOf(store.gc())).toBe('E_MANIFEST_INVALID');
    await store.remove('bad');
    expect(await store.gc()).toEqual({ blobsRemoved: 1, bytesFreed: MiB });
    expect(existsSync(join(root, 'blobs', 'stray'))).toBe(true);
    expect((await store.verify('good')).ok).toBe(true);
  });

  it('a file where a store directory belongs is a coded error', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    rmSync(join(root, 'snapshots'), { recursive: true });
    writeFileSync(join(root, 'snapshots'), 'x');
    for (const p of [store.list(), store.gc(), store.current('m'), store.history('m')]) expect(await codeOf(p)).toBe('E_STORE_INVALID');
    rmSync(join(root, 'blobs'), { recursive: true });
    writeFileSync(join(root, 'blobs'), 'x');
    expect(await codeOf(store.usage())).toBe('E_STORE_INVALID');
  });
});

describe('which capture is current does not depend on the wall clock', () => {
  it('a capture made after the clock was set back becomes current', async () => {
    const store = await RegionStore.open(tempDir());
    await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const now = Date.now();
    vi.spyOn(Date, 'now').mockReturnValue(now - 86_400_000);
    const later = await Snapshot.capture(store, 'm', { regions: regions({ y: MiB }) });
    expect((await store.current('m'))?.id).toBe(later.id);
  });

  it('junk in `current` is replaced by the next capture', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    writeFileSync(join(root, 'snapshots', 'm', 'current'), 'zzzzzzzzzzzzzz\n');
    const next = await Snapshot.capture(store, 'm', { regions: regions({ y: MiB }) });
    expect((await store.current('m'))?.id).toBe(next.id);
  });

  it('a capture that started before a newer one was published does not replace it', async () => {
    const store = await RegionStore.open(tempDir());
    const slow = await store.beginCapture('m', 0); // started first
    const fast = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const late = Manifest.parse({ ...fast.manifest.toJSON(), id: slow.id });
    await slow.publish(late, []);
    expect((await store.current('m'))?.id).toBe(fast.id);
    expect((await store.history('m')).map((m) => m.id).sort()).toEqual([fast.id, slow.id].sort());
    // while one started after `fast` was published does
    const next = await store.beginCapture('m', 0);
    await next.publish(Manifest.parse({ ...fast.manifest.toJSON(), id: next.id }), []);
    expect((await store.current('m'))?.id).toBe(next.id);
  });
});

describe('writers do not starve behind readers', () => {
  it('a capture publishes while a reader holds the blob lock; remove too', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root, { lockTimeoutMs: 150 });
    const first = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    const reader = await acquireLock(join(root, '.lock'), false, 1000); // a restore in progress
    try {
      const second = await Snapshot.capture(store, 'm', { regions: regions({ y: MiB }) });
      expect((await store.current('m'))?.id).toBe(second.id);
      expect(await store.remove('m', { id: first.id })).toEqual([first.id]);
      // gc is the one writer that waits for readers (it deletes blobs they may be reading)
      expect(await codeOf(store.gc())).toBe('E_STORE_LOCKED');
    } finally {
      reader();
    }
    expect(await store.gc()).toEqual({ blobsRemoved: 1, bytesFreed: MiB });
  });

  it('publish waits for gc (exclusive blob lock) and for remove (meta lock); a capture that cannot publish leaves nothing behind', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root, { lockTimeoutMs: 150 });
    const first = await Snapshot.capture(store, 'm', { regions: regions({ x: MiB }) });
    for (const [file, exclusive] of [
      ['.lock', true],
      ['.meta.lock', true],
    ] as const) {
      const held = await acquireLock(join(root, file), exclusive, 1000);
      try {
        expect(await codeOf(Snapshot.capture(store, 'm', { regions: regions({ y: MiB }) }))).toBe('E_STORE_LOCKED');
      } finally {
        held();
      }
      expect((await store.current('m'))?.id).toBe(first.id);
      expect(readdirSync(join(root, 'tmp')).filter((e) => !e.startsWith('.'))).toEqual([]);
    }
  });
});
