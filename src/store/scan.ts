import { type Dirent, lstatSync } from 'node:fs';
import { readdir, rm, unlink } from 'node:fs/promises';
import { join } from 'node:path';

import { toVsnapError } from '../errors.js';
import { checkEntry, linkRefused } from './layout.js';
import { tryLock } from './lock.js';
import { validateName } from './names.js';
import type { StoreProblem } from './types.js';

/** A blob's name: its sha256 digest in lowercase hex. @internal */
export const DIGEST = /^[0-9a-f]{64}$/;

/** Runs `fn`, turning whatever it throws into a VsnapError. @internal */
export async function guard<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw toVsnapError(err);
  }
}

/**
 * Every blob file under `root/blobs`: regular files named by a digest inside a two-digit prefix
 * directory. Stray files are skipped; a link anywhere in blobs/ is refused (E_STORE_UNSAFE).
 * @internal
 */
export async function* blobFiles(storeRoot: string): AsyncGenerator<{ path: string; digest: string; size: number }> {
  const root = join(storeRoot, 'blobs');
  checkEntry(root, 'dir');
  for (const prefix of await readdir(root, { withFileTypes: true })) {
    const prefixPath = join(root, prefix.name);
    if (prefix.isSymbolicLink()) throw linkRefused(prefixPath);
    if (!prefix.isDirectory() || !/^[0-9a-f]{2}$/.test(prefix.name)) continue;
    for (const entry of await readdir(prefixPath, { withFileTypes: true })) {
      const path = join(prefixPath, entry.name);
      if (entry.isSymbolicLink()) throw linkRefused(path);
      if (!entry.isFile() || !DIGEST.test(entry.name) || !entry.name.startsWith(prefix.name)) continue;
      let size: number;
      try {
        size = lstatSync(path).size;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue; // removed meanwhile
        throw err;
      }
      yield { path, digest: entry.name, size };
    }
  }
}

/**
 * The snapshot directories under `root/snapshots` (dot-entries skipped), and every other entry
 * there as a problem: a link (E_STORE_UNSAFE), a stray file or an invalid name (E_STORE_INVALID).
 * @internal
 */
export async function snapshotEntries(storeRoot: string): Promise<{ names: string[]; problems: StoreProblem[] }> {
  const root = join(storeRoot, 'snapshots');
  checkEntry(root, 'dir');
  const names: string[] = [];
  const problems: StoreProblem[] = [];
  for (const entry of (await readdir(root, { withFileTypes: true })) as Dirent[]) {
    if (entry.name.startsWith('.')) continue;
    const path = join(root, entry.name);
    if (entry.isSymbolicLink()) {
      problems.push({ name: entry.name, code: 'E_STORE_UNSAFE', message: linkRefused(path).message });
    } else if (!entry.isDirectory()) {
      problems.push({ name: entry.name, code: 'E_STORE_INVALID', message: `${path} is a stray file, not a snapshot directory: move it out of the store.` });
    } else {
      try {
        names.push(validateName(entry.name));
      } catch (err) {
        problems.push({ name: entry.name, code: 'E_STORE_INVALID', message: `${path} is not a valid snapshot name: ${(err as Error).message}` });
      }
    }
  }
  return { names, problems };
}

/**
 * Removes `root/tmp` entries of writers that died: unlocked, and older than a grace period.
 * Links are removed as links (their targets untouched), first, so a dead writer's directory is
 * not kept for a lock file that was a link.
 * @internal
 */
export async function cleanTmp(storeRoot: string, graceMs: number): Promise<void> {
  const tmp = join(storeRoot, 'tmp');
  checkEntry(tmp, 'dir');
  const now = Date.now();
  const entries = (await readdir(tmp, { withFileTypes: true })).sort((x, y) => Number(y.isSymbolicLink()) - Number(x.isSymbolicLink()));
  for (const entry of entries) {
    const path = join(tmp, entry.name);
    let mtime: number;
    try {
      mtime = lstatSync(path).mtimeMs;
    } catch {
      continue;
    }
    if (now - mtime < graceMs) continue;
    if (entry.isSymbolicLink()) {
      await unlink(path); // the link only, never its target
    } else if (entry.name.endsWith('.lock') && entry.isFile()) {
      const release = tryLock(path, true);
      if (!release) continue; // its writer is alive
      try {
        await rmEntry(path.slice(0, -'.lock'.length));
        await rm(path, { force: true });
      } finally {
        release();
      }
    } else if (!existsEntry(`${path}.lock`)) {
      await rmEntry(path);
    }
  }
}

function existsEntry(path: string): boolean {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Removes a tmp/ entry: a link is unlinked (its target untouched), a directory removed recursively. */
async function rmEntry(path: string): Promise<void> {
  let st;
  try {
    st = lstatSync(path);
  } catch {
    return;
  }
  if (st.isDirectory()) await rm(path, { recursive: true, force: true });
  else await unlink(path);
}
