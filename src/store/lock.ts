import { closeSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

import { toVsnapError, VsnapError } from '../errors.js';
import { native } from '../native/index.js';
import { checkEntry } from './layout.js';

/**
 * Takes an flock(2) on `path`: shared (readers) or exclusive (writers). Locks are per open file,
 * so they order work between processes and between concurrent operations of one process, and
 * the kernel drops them when a process dies (even by SIGKILL). Polls without blocking the event
 * loop; throws E_STORE_LOCKED after `timeoutMs`. Returns the release function.
 * @internal
 */
export async function acquireLock(path: string, exclusive: boolean, timeoutMs: number, readOnly = false): Promise<() => void> {
  const deadline = Date.now() + timeoutMs;
  let wait = 5;
  for (;;) {
    const release = tryLock(path, exclusive, readOnly);
    if (release) return release;
    if (Date.now() >= deadline) {
      throw new VsnapError(
        'E_STORE_LOCKED',
        `could not take the ${exclusive ? 'exclusive' : 'shared'} store lock ${path} within ${timeoutMs} ms: ` +
          'a vsnap operation (of this or another process) is restoring from, capturing into, removing from or collecting garbage in this store. Retry once it has ended, or raise lockTimeoutMs.',
        { path },
      );
    }
    await sleep(wait);
    wait = Math.min(wait * 2, 200);
  }
}

/**
 * Takes the lock only if free now; returns its (idempotent) release, or undefined. A lock file
 * that is a link is refused (E_STORE_UNSAFE) rather than followed: the native open creates it
 * with O_CREAT, which would create the link's target. `readOnly`: the file is opened read-only
 * (flock needs no write access) and never created; when there is none, no writer has locked
 * the store yet (every writer creates it first), and the release does nothing.
 * @internal
 */
export function tryLock(path: string, exclusive: boolean, readOnly = false): (() => void) | undefined {
  checkEntry(path, 'file');
  let fd: number;
  try {
    fd = native().tryLockFile(path, exclusive, readOnly);
  } catch (err) {
    throw toVsnapError(err);
  }
  if (fd === -2 && readOnly) return () => {};
  if (fd < 0) return undefined;
  let released = false;
  return () => {
    if (!released) {
      released = true;
      closeSync(fd);
    }
  };
}
