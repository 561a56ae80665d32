import { availableParallelism } from 'node:os';

/**
 * How many chunks the CPU codec works on at once: the threads of libuv's pool by default (4), no
 * more than the cores.
 * @internal
 */
export function codecConcurrency(): number {
  return Math.max(1, Math.min(4, availableParallelism()));
}

/**
 * Runs `work(i)` for i in [0, n) with at most `limit` at once, and hands each result to `take` in
 * order of i (the works after i go on while `take` handles i). On a failure no new work starts, the works
 * already started are waited for (none is left running), and the first error is thrown.
 * @internal
 */
export async function inOrder<T>(n: number, limit: number, work: (i: number) => Promise<T>, take: (result: T, i: number) => Promise<void> | void): Promise<void> {
  const started: Array<Promise<T>> = [];
  const start = (i: number): void => {
    const p = work(i);
    p.catch(() => undefined); // handled where it is awaited, in order; this keeps a later one's rejection from counting as unhandled
    started.push(p);
  };
  let next = 0;
  try {
    for (let i = 0; i < n; i++) {
      while (next < n && next < i + Math.max(1, limit)) start(next++);
      await take(await started[i]!, i);
    }
  } catch (err) {
    await Promise.allSettled(started);
    throw err;
  }
}
