import { closeSync, constants, lstatSync, openSync, readSync, type Stats } from 'node:fs';
import { open } from 'node:fs/promises';

import { toVsnapError, VsnapError } from '../errors.js';

/**
 * The store never follows a link inside its root: every path it reads, writes, locks or removes
 * below the root is checked with lstat (directories and lock files) or opened with O_NOFOLLOW
 * (files it reads). A link, or an entry of the wrong type where the store keeps its own files,
 * is refused with E_STORE_UNSAFE / E_STORE_INVALID before anything is touched through it.
 *
 * What this cannot close without openat(2): a path component swapped for a link between the
 * check and the use by someone who can write inside the store. Such a user can already destroy
 * every snapshot; the checks stop a store whose layout has links (a mistake, an untrusted copy)
 * from reaching outside its root.
 * @internal
 */

/** What an entry is: absent, or its lstat (never following a link). */
function lstatOrUndefined(path: string): Stats | undefined {
  try {
    return lstatSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return undefined;
    if (code === 'ENOTDIR') {
      // A parent is a file: report it as such, not as a raw ENOTDIR.
      throw new VsnapError('E_STORE_INVALID', `${path} cannot exist: one of its parents is not a directory. Remove the stray file.`, { path });
    }
    throw toVsnapError(err);
  }
}

/** E_STORE_UNSAFE for a link found at `path`. @internal */
export function linkRefused(path: string): VsnapError {
  return new VsnapError(
    'E_STORE_UNSAFE',
    `${path} is a symbolic link inside the store; vsnap never follows links below a store's root, so it refuses to use it. ` +
      'Replace the link by the directory or file itself (or move the whole store and point vsnap at its real location).',
    { path },
  );
}

/**
 * Checks that `path` is absent or a real directory (or regular file), never a link.
 * Returns true when it exists.
 * @internal
 */
export function checkEntry(path: string, kind: 'dir' | 'file'): boolean {
  const st = lstatOrUndefined(path);
  if (!st) return false;
  if (st.isSymbolicLink()) throw linkRefused(path);
  const ok = kind === 'dir' ? st.isDirectory() : st.isFile();
  if (!ok) {
    throw new VsnapError('E_STORE_INVALID', `${path} should be a ${kind === 'dir' ? 'directory' : 'regular file'} of the store; something else is there. Move it away.`, {
      path,
    });
  }
  return true;
}

const O_READ_NOFOLLOW = constants.O_RDONLY | constants.O_NOFOLLOW;

function readError(path: string, err: unknown): VsnapError {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ELOOP') return linkRefused(path);
  if (code === 'ENOTDIR') return new VsnapError('E_STORE_INVALID', `${path} cannot be read: one of its parents is not a directory. Remove the stray file.`, { path });
  return toVsnapError(err);
}

/** A store file's text, read without following a link; undefined when absent. @internal */
export async function readStoreText(path: string): Promise<string | undefined> {
  let handle;
  try {
    handle = await open(path, O_READ_NOFOLLOW);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw readError(path, err);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw new VsnapError('E_STORE_INVALID', `${path} should be a regular file of the store; something else is there.`, { path });
    return await handle.readFile('utf8');
  } catch (err) {
    throw readError(path, err);
  } finally {
    await handle.close();
  }
}

/** The synchronous form of {@link readStoreText}, for small files. @internal */
export function readStoreTextSync(path: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(path, O_READ_NOFOLLOW);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw readError(path, err);
  }
  try {
    const chunks: Buffer[] = [];
    const buf = Buffer.alloc(4096);
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      chunks.push(Buffer.from(buf.subarray(0, n)));
      if (chunks.length > 256) throw new VsnapError('E_STORE_INVALID', `${path} is far larger than a store pointer file`, { path });
    }
    return Buffer.concat(chunks).toString('utf8');
  } catch (err) {
    throw readError(path, err);
  } finally {
    closeSync(fd);
  }
}

/** An id or name read from a pointer file: the same rules as a snapshot name. */
const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/**
 * The `current` pointer of a snapshot: the capture id, and the store's publish sequence number
 * when it was written (0 for pointers written before sequence numbers existed).
 * @internal
 */
export type CurrentPointer = { id: string; seq: number } | { junk: string };

/** Parses a `current` file: `<id>\n<seq>\n` (or `<id>\n`). Anything else is junk. @internal */
export function parseCurrent(text: string): CurrentPointer {
  const lines = text.split('\n').filter((l) => l.length > 0);
  const id = lines[0]?.trim() ?? '';
  const seqText = lines[1]?.trim();
  const seq = seqText === undefined ? 0 : Number(seqText);
  if (lines.length > 2 || !ID.test(id) || !Number.isSafeInteger(seq) || seq < 0) return { junk: text.slice(0, 200) };
  return { id, seq };
}

/** Parses the store's publish sequence file (a decimal number); junk reads as 0. @internal */
export function parseSeq(text: string | undefined): number {
  const n = Number(text?.trim() ?? '0');
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
}
