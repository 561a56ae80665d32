import { execFile } from 'node:child_process';
import { chmodSync, cpSync, mkdirSync, readdirSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { tryLock } from '../../src/store/lock.js';
import { RegionStore } from '../../src/store/region-store.js';
import { cliPath } from '../helpers/cli.js';
import { holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const open: HostRegion[] = [];
afterEach(() => {
  for (const r of open.splice(0)) r.close();
});

/** A store with one capture, `a`, of two regions. */
async function storeWithCapture(): Promise<string> {
  const root = join(tempDir(), 'store');
  const store = await RegionStore.open(root);
  const map = patternedRegions({ x: 2 * MiB, y: MiB });
  open.push(...map.values());
  await Snapshot.capture(store, 'a', { regions: [...map].map(([key, r]) => ({ key, size: r.size, memory: r.memory })) });
  return root;
}

/** Every path under `root` with its size and mtime: what a read-only open must leave as it was. */
function tree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      const st = statSync(p);
      out[relative(root, p)] = `${e.isDirectory() ? 'dir' : st.size} ${st.mtimeMs}`;
      if (e.isDirectory()) walk(p);
    }
  };
  walk(root);
  return out;
}

const code = (p: Promise<unknown>) => p.then(() => 'ok', (e: unknown) => (e as VsnapError).code);

describe('RegionStore.open(root, { readOnly: true })', () => {
  it('lists, verifies and restores without creating, writing or cleaning anything', async () => {
    const root = await storeWithCapture();
    // a stale temporary entry a writable open would clean
    mkdirSync(join(root, 'tmp', 'stale'));
    const old = new Date(Date.now() - 3600_000);
    writeFileSync(join(root, 'tmp', 'stale', 'x'), 'x');
    utimesSync(join(root, 'tmp', 'stale'), old, old);
    const before = tree(root);
    const store = await RegionStore.open(root, { readOnly: true });
    expect(store.readOnly).toBe(true);
    expect((await store.list()).map((s) => s.name)).toEqual(['a']);
    expect((await store.verify('a')).ok).toBe(true);
    const snap = await Snapshot.open(store, 'a');
    const targets = [...['x', 'y']].map((key) => {
      const r = HostRegion.create(key === 'x' ? 2 * MiB : MiB);
      open.push(r);
      return { key, r };
    });
    await snap.restore({ regions: targets.map(({ key, r }) => ({ key, size: r.size, memory: r.memory })) });
    for (const { key, r } of targets) expect(holdsPattern(r, key)).toBe(true);
    expect(tree(root)).toEqual(before);
  });

  it('takes a real shared flock (gc waits for it) through a lock file it opens read-only', async () => {
    const root = await storeWithCapture();
    const store = await RegionStore.open(root, { readOnly: true });
    await store.withLock(false, async () => {
      expect(tryLock(join(root, '.lock'), true)).toBeUndefined(); // a writer's exclusive lock (gc) must wait
      const shared = tryLock(join(root, '.lock'), false); // other readers share it
      expect(shared).toBeDefined();
      shared!();
    });
    const free = tryLock(join(root, '.lock'), true);
    expect(free).toBeDefined();
    free!();
  });

  it('a store no writer has locked yet (no .lock): reads work and no lock file is made', async () => {
    const root = await storeWithCapture();
    rmSync(join(root, '.lock'));
    rmSync(join(root, '.meta.lock'), { force: true });
    const store = await RegionStore.open(root, { readOnly: true });
    expect((await store.verify('a')).ok).toBe(true);
    expect(readdirSync(root)).not.toContain('.lock');
  });

  it('refuses captures, remove and gc; refuses a missing or empty directory and creates nothing', async () => {
    const root = await storeWithCapture();
    const store = await RegionStore.open(root, { readOnly: true });
    expect(await code(store.beginCapture('b', 1))).toBe('E_INVALID_ARGUMENT');
    expect(await code(store.remove('a'))).toBe('E_INVALID_ARGUMENT');
    expect(await code(store.gc())).toBe('E_INVALID_ARGUMENT');
    expect(await code(store.withLock(true, async () => 0))).toBe('E_INVALID_ARGUMENT');
    expect((await store.list()).map((s) => s.name)).toEqual(['a']);
    const missing = join(tempDir(), 'nowhere');
    const refused = await RegionStore.open(missing, { readOnly: true }).catch((e: unknown) => e as VsnapError);
    expect(refused).toMatchObject({ code: 'E_STORE_INVALID', message: `no store at ${missing}` }); // no advice to create one
    expect(await code(RegionStore.open(missing, { readOnly: true, create: true }))).toBe('E_INVALID_ARGUMENT');
    const empty = tempDir();
    expect(await code(RegionStore.open(empty, { readOnly: true }))).toBe('E_STORE_INVALID');
    expect(readdirSync(empty)).toEqual([]);
    expect(() => statSync(missing)).toThrow();
  });
});

// The command as another user on a store it may only read: `chmod -R a-w` does not stop root,
// so the CLI runs as nobody (uid 65534), from a copy of what it needs in a directory it can enter
// (the checkout may sit where other users cannot, as a clean clone under `mktemp -d` does).
describe.skipIf(process.getuid?.() !== 0)('vsnap ls / verify on a store the user may not write', () => {
  it('read the store; rm is refused by the file system', async () => {
    const root = await storeWithCapture();
    const pkg = join(tempDir('vsnap-ro-cli-'), 'vsnap');
    const from = join(cliPath, '..', '..', '..');
    for (const p of ['package.json', 'dist', 'prebuilds']) cpSync(join(from, p), join(pkg, p), { recursive: true });
    const { stdout } = await promisify(execFile)('npm', ['ls', '--omit=dev', '--all', '--parseable'], { cwd: from });
    for (const dir of stdout.trim().split('\n').slice(1)) cpSync(dir, join(pkg, relative(from, dir)), { recursive: true });
    const top = join(pkg, '..');
    chmodSync(top, 0o755);
    chmodSync(join(root, '..'), 0o755);
    await promisify(execFile)('chmod', ['-R', 'a+rX', top]);
    await promisify(execFile)('chmod', ['-R', 'a-w', root]);
    const before = tree(root);
    const run = (...args: string[]) =>
      promisify(execFile)(process.execPath, [join(pkg, 'dist', 'cli', 'main.js'), ...args, '--store', root], { uid: 65534, gid: 65534, cwd: '/' }).then(
        (r) => ({ code: 0, ...r }),
        (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, stdout: e.stdout, stderr: e.stderr }),
      );
    const verify = await run('verify', 'a', '--json');
    expect(verify, verify.stderr).toMatchObject({ code: 0 });
    expect(JSON.parse(verify.stdout)).toMatchObject({ name: 'a', ok: true });
    const ls = await run('ls');
    expect(ls, ls.stderr).toMatchObject({ code: 0 });
    expect(ls.stdout).toMatch(/^NAME .*\na /);
    expect((await run('ls', '--all')).code).toBe(0);
    // a command that writes still fails, as it should, with the file system's refusal
    const rm = await run('rm', 'a', '--json');
    expect(rm.code).not.toBe(0);
    expect(JSON.parse(rm.stdout)).toMatchObject({ code: 'E_IO' });
    expect(tree(root)).toEqual(before);
  });
});
