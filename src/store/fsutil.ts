import { closeSync, fsyncSync, mkdirSync, openSync, renameSync, statSync, writeSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';

/** fsync a directory, so a rename or unlink inside it survives a power cut. @internal */
export function fsyncDir(path: string): void {
  const fd = openSync(path, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * mkdir -p, with the parent of the first directory it creates fsynced, so the new directory
 * survives a power cut (nothing to sync when it already existed). @internal
 */
export function mkdirDurable(path: string): void {
  const first = mkdirParents(path);
  if (first !== undefined) fsyncDir(dirname(first));
}

/**
 * mkdir -p, one directory at a time: Node 20's `mkdirSync(path, { recursive: true })` never
 * returns where mkdir answers ENOENT under a directory that exists (`/proc/x`); this throws
 * mkdir's error instead. Returns the first directory it made, as the recursive form does. @internal
 */
export function mkdirParents(path: string, mode = 0o777): string | undefined {
  const missing: string[] = [];
  for (let dir = resolve(path); dirname(dir) !== dir; dir = dirname(dir)) {
    try {
      statSync(dir);
      break; // exists (a file here makes the mkdir below fail with ENOTDIR)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      missing.push(dir);
    }
  }
  missing.reverse();
  for (const dir of missing) {
    try {
      mkdirSync(dir, { mode });
    } catch (err) {
      // made meanwhile by someone else: fine; anything else (ENOENT on /proc, EACCES, EROFS) is the answer
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || !statSync(dir).isDirectory()) throw err;
    }
  }
  return missing[0];
}

/** Writes and fsyncs a file at `tmpPath`. @internal */
export function writeFileDurable(tmpPath: string, data: string, mode = 0o644): void {
  const fd = openSync(tmpPath, 'w', mode);
  try {
    const buf = Buffer.from(data);
    let done = 0;
    while (done < buf.length) done += writeSync(fd, buf, done, buf.length - done);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * Publishes `data` at `path` atomically: written to `tmpPath` (same file system), fsynced,
 * renamed over `path`, and the directory fsynced. Readers see the old file or the new one.
 * @internal
 */
export function replaceFileAtomic(path: string, tmpPath: string, data: string, mode = 0o644): void {
  writeFileDurable(tmpPath, data, mode);
  renameSync(tmpPath, path);
  fsyncDir(dirname(path));
}

/** The file's text, or undefined if it does not exist. @internal */
export async function readTextIfExists(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}
