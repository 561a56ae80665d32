// Every link and stray-file layout of a store: each store operation, by a process that had the
// store open before the layout changed and by opening it anew, either works or fails with a coded
// VsnapError (never a raw ENOTDIR); every link is refused (E_STORE_UNSAFE) by the operations that
// would go through it; nothing outside the store is changed, created or deleted; no descriptor
// leaks.
import { createHash } from 'node:crypto';
import { lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';
import { record } from './figures.js';
import { type LeakLine, noLeak } from './leaks.js';

const SIZE = 64 * 1024;
const leaks: LeakLine[] = [];
const outcomes: Record<string, Record<string, string>> = {};
const tally = { layouts: 0, operations: 0, ok: 0, coded: 0, raw: 0, outsideChanged: 0 }; // ok: resolved (problems reported or none)

interface Ctx {
  root: string;
  out: string;
  a: Snapshot;
  b: Snapshot;
}

/** Moves `path` out of the store into `out` and puts a link to it in its place. */
function linkOut(ctx: Ctx, rel: string): void {
  const inside = join(ctx.root, rel);
  const outside = join(ctx.out, rel.replaceAll('/', '_'));
  renameSync(inside, outside);
  symlinkSync(outside, inside);
}

const blobOf = (s: Snapshot): string => s.manifest.data.ranks[0]!.regions[0]!.blob;
const old = new Date(Date.now() - 3_600_000);

const LAYOUTS: Record<string, (ctx: Ctx) => void> = {
  'link: tmp/': (c) => linkOut(c, 'tmp'),
  'link: blobs/': (c) => linkOut(c, 'blobs'),
  'link: snapshots/': (c) => linkOut(c, 'snapshots'),
  'link: blobs/<xx>/': (c) => linkOut(c, `blobs/${blobOf(c.a).slice(0, 2)}`),
  'link: a blob': (c) => linkOut(c, `blobs/${blobOf(c.a).slice(0, 2)}/${blobOf(c.a)}`),
  'link: snapshots/<name>/': (c) => linkOut(c, 'snapshots/a'),
  'link: current': (c) => linkOut(c, 'snapshots/a/current'),
  'link: a manifest': (c) => linkOut(c, `snapshots/a/${c.a.id}.json`),
  'link: .lock (dangling)': (c) => {
    rmSync(join(c.root, '.lock'), { force: true });
    symlinkSync(join(c.out, 'lock-target'), join(c.root, '.lock'));
  },
  'link: .meta.lock (dangling)': (c) => {
    rmSync(join(c.root, '.meta.lock'), { force: true });
    symlinkSync(join(c.out, 'meta-lock-target'), join(c.root, '.meta.lock'));
  },
  'link: publish-seq': (c) => linkOut(c, 'publish-seq'),
  'link: vsnap-store.json': (c) => linkOut(c, 'vsnap-store.json'),
  'link: a tmp/ entry (old)': (c) => {
    mkdirSync(join(c.out, 'victim'));
    writeFileSync(join(c.out, 'victim', 'f'), 'x');
    symlinkSync(join(c.out, 'victim'), join(c.root, 'tmp', 'deadbeef'));
    utimesSync(join(c.out, 'victim'), old, old);
  },
  'link: a tmp/ lock file (old)': (c) => {
    writeFileSync(join(c.out, 'victim.lock'), '');
    symlinkSync(join(c.out, 'victim.lock'), join(c.root, 'tmp', 'deadbeef.lock'));
    mkdirSync(join(c.root, 'tmp', 'deadbeef'));
    utimesSync(join(c.root, 'tmp', 'deadbeef'), old, old);
  },
  'link: an extra snapshots/<name>': (c) => {
    mkdirSync(join(c.out, 'extra'));
    writeFileSync(join(c.out, 'extra', `${c.a.id}.json`), readFileSync(join(c.root, 'snapshots', 'a', `${c.a.id}.json`)));
    symlinkSync(join(c.out, 'extra'), join(c.root, 'snapshots', 'x'));
  },
  'stray file: blobs/': (c) => writeFileSync(join(c.root, 'blobs', 'stray'), 'x'),
  'stray file: blobs/<xx>/': (c) => writeFileSync(join(c.root, 'blobs', blobOf(c.a).slice(0, 2), 'stray'), 'x'),
  'stray directory: blobs/<xx>/': (c) => mkdirSync(join(c.root, 'blobs', blobOf(c.a).slice(0, 2), 'a-dir')),
  'stray file: snapshots/': (c) => writeFileSync(join(c.root, 'snapshots', 'stray'), 'x'),
  'stray file: snapshots/<name>/': (c) => writeFileSync(join(c.root, 'snapshots', 'a', 'notes.txt'), 'x'),
  'stray file: tmp/ (old)': (c) => {
    writeFileSync(join(c.root, 'tmp', 'stray'), 'x');
    utimesSync(join(c.root, 'tmp', 'stray'), old, old);
  },
  'junk: current names ../../x': (c) => writeFileSync(join(c.root, 'snapshots', 'a', 'current'), '../../x\n'),
  'junk: current empty': (c) => writeFileSync(join(c.root, 'snapshots', 'a', 'current'), ''),
  'junk: a manifest': (c) => {
    rmSync(join(c.root, 'snapshots', 'a', `${c.a.id}.json`));
    writeFileSync(join(c.root, 'snapshots', 'a', `${c.a.id}.json`), '{"schemaVersion":1,');
  },
  "junk: another snapshot's manifest": (c) => writeFileSync(join(c.root, 'snapshots', 'a', `${c.b.id}.json`), readFileSync(join(c.root, 'snapshots', 'b', `${c.b.id}.json`))),
  'junk: publish-seq': (c) => writeFileSync(join(c.root, 'publish-seq'), 'not a number'),
  'missing: a blob': (c) => rmSync(join(c.root, 'blobs', blobOf(c.a).slice(0, 2), blobOf(c.a))),
  'file instead of a directory: blobs/': (c) => {
    rmSync(join(c.root, 'blobs'), { recursive: true });
    writeFileSync(join(c.root, 'blobs'), 'x');
  },
  'file instead of a directory: snapshots/': (c) => {
    rmSync(join(c.root, 'snapshots'), { recursive: true });
    writeFileSync(join(c.root, 'snapshots'), 'x');
  },
  'file instead of a directory: tmp/': (c) => {
    rmSync(join(c.root, 'tmp'), { recursive: true });
    writeFileSync(join(c.root, 'tmp'), 'x');
  },
  'file instead of a directory: snapshots/<name>/': (c) => {
    rmSync(join(c.root, 'snapshots', 'a'), { recursive: true });
    writeFileSync(join(c.root, 'snapshots', 'a'), 'x');
  },
  'file instead of a directory: blobs/<xx>/': (c) => {
    const prefix = join(c.root, 'blobs', blobOf(c.a).slice(0, 2));
    rmSync(prefix, { recursive: true });
    writeFileSync(prefix, 'x');
  },
};

/** Everything under `dir`: path -> content hash, link target or 'dir' (never following links). */
function tree(dir: string, out = new Map<string, string>(), base = dir): Map<string, string> {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    const st = lstatSync(path);
    const rel = path.slice(base.length);
    if (st.isSymbolicLink()) out.set(rel, `link ${readlinkSync(path)}`);
    else if (st.isDirectory()) {
      out.set(rel, 'dir');
      tree(path, out, base);
    } else out.set(rel, createHash('sha256').update(readFileSync(path)).digest('hex'));
  }
  return out;
}

/**
 * Every store operation, on `running` (a store opened before the layout changed: a long-lived
 * process) and by opening the store anew.
 */
async function operations(root: string, running: RegionStore): Promise<Record<string, string>> {
  const seen: Record<string, string> = {};
  const sources = patternedRegions({ x: SIZE });
  const target = HostRegion.create(SIZE);
  const run = async (name: string, fn: () => Promise<unknown>): Promise<void> => {
    tally.operations++;
    try {
      const result = await fn();
      const problems = (result as { problems?: Array<{ code: string }> } | undefined)?.problems ?? [];
      // list and verify report problems rather than throw: the codes they report are outcomes too
      seen[name] = problems.length ? `reported ${[...new Set(problems.map((p) => p.code))].join(',')}` : 'ok';
      tally.ok++;
    } catch (err) {
      if (!(err instanceof VsnapError)) {
        tally.raw++;
        seen[name] = `RAW ${(err as Error).message}`;
        return;
      }
      seen[name] = err.code;
      tally.coded++;
    }
  };
  try {
    await run('open', () => RegionStore.open(root, { tmpGraceMs: 0 }));
    const s = running;
    await run('list', () => s.list());
    await run('usage', () => s.usage());
    await run('current', () => s.current('a'));
    await run('get', () => s.get('b'));
    await run('history', () => s.history('a'));
    await run('verify', () => s.verify('a'));
    await run('restore', async () => (await Snapshot.open(s, 'a')).restore({ regions: [{ key: 'x', size: SIZE, memory: target.memory }] }));
    await run('capture', () => Snapshot.capture(s, 'a', { regions: [{ key: 'x', size: SIZE, memory: sources.get('x')!.memory }], chunkSize: SIZE }));
    await run('remove', () => s.remove('b'));
    await run('gc', () => s.gc());
  } finally {
    target.close();
    for (const r of sources.values()) r.close();
  }
  return seen;
}

afterAll(() => {
  record('layouts', { ...tally, outcomes, leaks });
});

describe('every link and stray-file layout of a store', () => {
  it.each(Object.keys(LAYOUTS))('%s', async (layout) => {
    const root = tempDir();
    const out = tempDir('vsnap-outside-');
    writeFileSync(join(out, 'sentinel'), 'outside the store');
    const store = await RegionStore.open(root);
    const regions = patternedRegions({ x: SIZE });
    let ctx: Ctx;
    try {
      const a = await Snapshot.capture(store, 'a', { regions: [{ key: 'x', size: SIZE, memory: regions.get('x')!.memory }], chunkSize: SIZE });
      const b = await Snapshot.capture(store, 'b', { regions: [{ key: 'x', size: SIZE, memory: regions.get('x')!.memory }], chunkSize: SIZE });
      ctx = { root, out, a, b };
    } finally {
      for (const r of regions.values()) r.close();
    }
    LAYOUTS[layout]!(ctx);
    const before = tree(out);
    let seen: Record<string, string> = {};
    await noLeak(layout, leaks, async () => {
      seen = await operations(root, store);
    });
    tally.layouts++;
    outcomes[layout] = seen;
    const after = tree(out);
    if (JSON.stringify([...after]) !== JSON.stringify([...before])) tally.outsideChanged++;
    expect(Object.entries(seen).filter(([, v]) => v.startsWith('RAW'))).toEqual([]);
    expect([...after]).toEqual([...before]);
    if (layout.startsWith('link: a tmp/')) {
      // a dead writer's leftovers: the link is removed as a link at open, its target untouched
      expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    } else if (layout.startsWith('link:')) {
      // any other link is never used: some operation refuses it with E_STORE_UNSAFE
      expect(Object.values(seen).join(' ')).toMatch(/E_STORE_UNSAFE/);
    }
  });
});
