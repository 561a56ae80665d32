// The CPU codec's chunks worked on several at once and taken in order (src/transfer/in-order.ts):
// the order, the bound, and a failure that leaves nothing running. Deferred promises settled by
// the test, no timers.
import { describe, expect, it } from 'vitest';

import { inOrder } from '../../src/transfer/in-order.js';

function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

const settle = () => new Promise<void>((r) => setImmediate(r));

describe('inOrder: chunks worked on at once, taken in order', () => {
  it('takes every result in order of its index, whatever order the works finish in, never more than the limit at once', async () => {
    const works = Array.from({ length: 7 }, () => deferred<string>());
    const started: number[] = [];
    const taken: Array<[string, number]> = [];
    let running = 0;
    let most = 0;
    const run = inOrder(
      7,
      3,
      async (i) => {
        started.push(i);
        most = Math.max(most, ++running);
        try {
          return await works[i]!.promise;
        } finally {
          running--;
        }
      },
      (r, i) => {
        taken.push([r, i]);
      },
    );
    await settle();
    expect(started).toEqual([0, 1, 2]);
    works[2]!.resolve('c');
    works[1]!.resolve('b');
    await settle();
    expect(taken).toEqual([]); // 0 is not done: nothing is taken out of order
    expect(started).toEqual([0, 1, 2]); // and no fourth starts while 0 holds the window
    works[0]!.resolve('a');
    for (let i = 3; i < 7; i++) {
      await settle();
      works[i]!.resolve(String.fromCharCode(97 + i));
    }
    await run;
    expect(taken).toEqual([['a', 0], ['b', 1], ['c', 2], ['d', 3], ['e', 4], ['f', 5], ['g', 6]]);
    expect(most).toBe(3);
  });

  it('on a failure starts nothing more, waits for the works already started, then throws the first error', async () => {
    const works = Array.from({ length: 6 }, () => deferred<number>());
    const started: number[] = [];
    let outcome: unknown = 'pending';
    const run = inOrder(6, 3, (i) => {
      started.push(i);
      return works[i]!.promise;
    }, () => undefined).then(() => 'resolved', (e: unknown) => e);
    void run.then((o) => (outcome = o));
    await settle();
    works[1]!.reject(new Error('chunk 1 is damaged')); // a later one fails first: handled, no unhandled rejection
    works[0]!.reject(new Error('chunk 0 is damaged'));
    await settle();
    expect(outcome).toBe('pending'); // chunk 2 still runs
    works[2]!.resolve(2);
    const e = await run;
    expect((e as Error).message).toBe('chunk 0 is damaged');
    expect(started).toEqual([0, 1, 2]);
  });

  it('a take that throws stops it the same way', async () => {
    const seen: number[] = [];
    await expect(
      inOrder(5, 2, async (i) => i, (r) => {
        seen.push(r);
        if (r === 1) throw new Error('disk full');
      }),
    ).rejects.toThrow('disk full');
    expect(seen).toEqual([0, 1]);
  });

  it('does nothing for no chunks, and works one at a time with a limit of 1', async () => {
    await inOrder(0, 4, () => Promise.reject(new Error('never called')), () => undefined);
    const order: string[] = [];
    await inOrder(3, 1, async (i) => {
      order.push(`work ${i}`);
      return i;
    }, (r) => {
      order.push(`take ${r}`);
    });
    expect(order).toEqual(['work 0', 'take 0', 'work 1', 'take 1', 'work 2', 'take 2']);
  });
});
