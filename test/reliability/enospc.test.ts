// A file system that fills up in the middle of a capture: the capture fails with E_NO_SPACE,
// the previous snapshot stays current and whole, nothing is stranded in tmp/, no descriptor leaks,
// and once there is room again a capture succeeds.
//
// How the small file system is made, first that works: a 16 MiB tmpfs mounted on a temporary
// directory (needs CAP_SYS_ADMIN: root on a machine or a privileged container), else the same
// capture in a child process under `prlimit --fsize` (RLIMIT_FSIZE: any user, no mount; writes
// past the limit fail with EFBIG, which vsnap reports as E_NO_SPACE too).
// VSNAP_ENOSPC_METHOD=tmpfs|fsize forces one.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';
import { bundle } from './bundle.js';
import { record } from './figures.js';
import { type LeakLine, noLeak } from './leaks.js';

const MiB = 2 ** 20;
const TMPFS_MIB = 16;
const held: HostRegion[] = [];
const leaks: LeakLine[] = [];
const figures: Record<string, unknown> = {};
let child = '';

function regions(prefix: string, n: number, size: number) {
  const sizes = Object.fromEntries(Array.from({ length: n }, (_, i) => [`${prefix}${i}`, size]));
  const map = patternedRegions(sizes);
  for (const r of map.values()) held.push(r);
  return [...map].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
}

/** Mounts a small tmpfs on a fresh directory; undefined where mounting is not permitted. */
function mountTmpfs(): string | undefined {
  if (process.env.VSNAP_ENOSPC_METHOD === 'fsize') return undefined;
  const dir = tempDir('vsnap-enospc-');
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${TMPFS_MIB}m,mode=0755`, 'tmpfs', dir], { stdio: 'pipe' });
    return dir;
  } catch (err) {
    if (process.env.VSNAP_ENOSPC_METHOD === 'tmpfs') throw err;
    return undefined;
  }
}

/** The previous snapshot is current, verifies, and restores to its exact bytes. */
async function previousIntact(store: RegionStore, id: string, keys: string[], size: number): Promise<void> {
  expect((await store.current('m'))?.id).toBe(id);
  expect((await store.verify('m')).ok).toBe(true);
  const targets = keys.map((key) => ({ key, region: HostRegion.create(size) }));
  try {
    await (await Snapshot.open(store, 'm')).restore({ regions: targets.map((t) => ({ key: t.key, size, memory: t.region.memory })) });
    for (const t of targets) expect(holdsPattern(t.region, t.key)).toBe(true);
  } finally {
    for (const t of targets) t.region.close();
  }
}

beforeAll(async () => {
  child = await bundle('capture-child.ts');
});
afterAll(() => {
  for (const r of held.splice(0)) r.close();
  record('enospc', { ...figures, leaks });
});

describe('ENOSPC in the middle of a capture', () => {
  it('E_NO_SPACE; the previous snapshot current and intact; tmp/ empty; no leak; room again, a capture succeeds', async () => {
    const mount = mountTmpfs();
    figures.method = mount ? `tmpfs of ${TMPFS_MIB} MiB (mount -t tmpfs)` : 'RLIMIT_FSIZE (prlimit --pid, set once the child is ready), in a child process';
    if (mount) {
      try {
        await onTmpfs(join(mount, 'store'));
      } finally {
        execFileSync('umount', [mount]);
      }
      return;
    }
    await underFsizeLimit();
  });
});

async function onTmpfs(root: string): Promise<void> {
  // the free-space check before a capture is bypassed (a huge negative margin), as when
  // another writer fills the disk after the check: the failure comes from the writes
  const store = await RegionStore.open(root, { spaceMarginBytes: -(2 ** 50) });
  const old = await Snapshot.capture(store, 'm', { regions: regions('old', 2, MiB), chunkSize: MiB });
  const attempts: string[] = [];
  await noLeak('capture on a full tmpfs', leaks, async () => {
    for (const [n, size] of [
      [3, 8 * MiB], // the first blob fits, the second does not
      [1, 15 * MiB], // the only blob does not
    ] as const) {
      const sources = patternedRegions(Object.fromEntries(Array.from({ length: n }, (_, i) => [`new${n}-${i}`, size])));
      const err = await Snapshot.capture(store, 'm', { regions: [...sources].map(([key, r]) => ({ key, size, memory: r.memory })), chunkSize: MiB })
        .catch((e: unknown) => e)
        .finally(() => {
          for (const r of sources.values()) r.close(); // the sources' own descriptors go with them
        });
      expect(err).toBeInstanceOf(VsnapError);
      expect((err as VsnapError).code).toBe('E_NO_SPACE');
      attempts.push(`${n} x ${size / MiB} MiB: ${(err as VsnapError).code} (${(err as VsnapError).message.split('\n')[0]!.slice(0, 80)})`);
      expect(readdirSync(join(root, 'tmp')).filter((e) => !e.startsWith('.'))).toEqual([]);
      await previousIntact(store, old.id, ['old0', 'old1'], MiB);
    }
  });
  figures.attempts = attempts;
  const again = await Snapshot.capture(store, 'm', { regions: regions('again', 2, 2 * MiB), chunkSize: MiB });
  expect((await store.current('m'))?.id).toBe(again.id);
  figures.previousIntact = true;
  figures.captureAfterwards = 'succeeded';
}

async function underFsizeLimit(): Promise<void> {
  const root = tempDir();
  const store = await RegionStore.open(root);
  const first = spawnSync(process.execPath, [child, root, 'm', 'old', String(MiB)], { encoding: 'utf8' });
  expect(first.stdout).toMatch(/published/);
  const oldId = (await store.current('m'))!.id;
  await noLeak('capture under RLIMIT_FSIZE', leaks, async () => {
  // the child makes its 4 MiB regions, then waits; the limit (2 MiB) is set on it from
  // outside, then it captures: the first blob's write fails
  const p = spawn(process.execPath, [child, root, 'm', 'new', String(4 * MiB)], { env: { ...process.env, VSNAP_CHILD_WAIT: '1' }, stdio: ['pipe', 'pipe', 'pipe'] });
  let output = '';
  const exited = new Promise<void>((resolve) => p.on('exit', () => resolve()));
  await new Promise<void>((resolve) => {
    p.stdout.on('data', (d: Buffer) => {
      output += d.toString();
      if (output.includes('ready')) resolve();
    });
  });
  execFileSync('prlimit', ['--pid', String(p.pid), `--fsize=${2 * MiB}`]);
  p.stdin.end('go\n');
  await exited;
  expect(output).toMatch(/failed E_NO_SPACE/);
  figures.attempts = [output.trim().split('\n').pop()!.slice(0, 140)];
  });
  const reopened = await RegionStore.open(root, { tmpGraceMs: 0 });
  expect(readdirSync(join(root, 'tmp')).filter((e) => !e.startsWith('.'))).toEqual([]);
  expect((await reopened.current('m'))?.id).toBe(oldId);
  expect((await reopened.verify('m')).ok).toBe(true);
  const again = spawnSync(process.execPath, [child, root, 'm', 'again', String(MiB)], { encoding: 'utf8' });
  expect(again.stdout).toMatch(/published/);
  figures.previousIntact = true;
  figures.captureAfterwards = 'succeeded';
}
