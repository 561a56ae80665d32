import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { native } from '../../src/native/index.js';
import { tempDir } from '../helpers/tmp.js';

// native/transfer/engine.cc starts worker threads; a thread that cannot be started (EAGAIN
// under a pids or ulimit cap, injected here) must neither terminate the process nor keep the
// staging slots it borrowed.

afterEach(() => native().setFault('thread-start', 0));

async function capture(threads: number, slots: number) {
  const b = native();
  const pool = await b.createStagingPool(1 << 16, slots, -1);
  const fd = b.createMemfd('src', 1 << 20);
  const blobPath = join(tempDir(), 'blob');
  const run = () =>
    b.startTransfer({
      op: 'capture',
      label: 'faults',
      pool,
      threads,
      regions: [{ name: 'r', blobPath, size: 1 << 20, chunkSize: 1 << 16, memory: { kind: 'host', fd } }],
    }).promise;
  return { pool, run, blobPath };
}

describe('transfer worker threads that cannot start', () => {
  it('no thread at all: the transfer rejects with a coded error and every slot is back', async () => {
    const { pool, run } = await capture(4, 8);
    native().setFault('thread-start', 1);
    await expect(run()).rejects.toMatchObject({ code: 'E_INTERNAL', message: expect.stringMatching(/thread limit/) });
    expect(pool.freeSlots).toBe(8);
    const ok = await run(); // and the pool still serves the next transfer
    expect(ok.checksums![0]).toHaveLength(16);
    expect(pool.freeSlots).toBe(8);
    pool.close();
  });

  it('some threads started: the transfer finishes on those, and every slot is back', async () => {
    const { pool, run, blobPath } = await capture(4, 8);
    const reference = await run();
    native().setFault('thread-start', 3, 1); // the first worker starts, the next three cannot
    const result = await run();
    expect(result.checksums).toEqual(reference.checksums);
    expect(readFileSync(blobPath).length).toBe(1 << 20);
    expect(pool.freeSlots).toBe(8);
    pool.close();
  });
});
