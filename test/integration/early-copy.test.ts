import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { VsnapError } from '../../src/errors.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { restoreEngineWith } from '../../src/flows/restore.js';
import { native } from '../../src/native/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import type { TransferProgress } from '../../src/transfer/transfer.js';
import { ask, useEngines } from '../helpers/engines.js';
import { fillInodes, openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// A restore from the RAM tier starts copying the first part of the weights into memory made for
// them while the engine's status is still being read (src/flows/restore-run.ts, Snapshot.startRestore):
// the engine's answer no longer stands before the first byte moves. Into memory of this process's
// own, so an engine that turns out not to match, or a failure anywhere, loses nothing and leaves
// nothing behind (the copy stopped and waited for before that memory goes, the RAM tier's lease let go).

const { engine } = useEngines();
const MiB = 1024 * 1024;

afterEach(() => {
  native().setFault('chunk-delay', 0);
  native().setFault('copy-fail', 0);
});

async function setup() {
  const { client } = await engine();
  const store = await RegionStore.open(tempDir());
  const before = await ask(client);
  const { snapshot } = await suspendEngine(store, 'early-copy', client, { captureIfNeeded: true });
  const cache = await RamTier.create({ budgetBytes: 64 * MiB, pin: false });
  await cache.load(store, snapshot.manifest);
  const status = client.wire.vsnapStatus.bind(client.wire);
  return { client, store, before, snapshot, cache, status };
}

/** Nothing of a failed or refused restore is left: no memory made for it, no descriptor, the RAM tier's lease let go (the entry can be evicted). */
function expectNothingLeft(cache: RamTier, id: string, fds: string[]): void {
  expect(fillInodes().size).toBe(0);
  expect(openFds()).toEqual(fds);
  expect(cache.evict(id)).toBe(true);
}

describe('the first part copied while the engine is read', () => {
  it('from the RAM tier, bytes land before the engine has answered its status, into the memory the engine then adopts', async () => {
    const { client, before, snapshot, cache, status } = await setup();
    try {
      let landedFirst!: () => void;
      const landed = new Promise<void>((resolve) => (landedFirst = resolve));
      const progress: TransferProgress[] = [];
      let atStatus: Set<number> | undefined;
      // only the restore's first read waits, for a landing that never comes unless the copy started before the engine answered
      client.inject({ route: 'status', pass: true, action: async () => {
        await landed;
        atStatus = fillInodes();
      } });
      let beforeWake: Set<number> | undefined;
      const onProgress = (p: TransferProgress): void => {
        progress.push(p);
        if (p.phase === 'copying' && p.bytesDone > 0) landedFirst();
      };
      const report = await restoreEngineWith(snapshot, client, { tiers: { ram: cache }, transfer: { onProgress } }, { beforeKvWake: async () => void (beforeWake = fillInodes()) });
      expect(report.tier).toBe('ram');
      for (const inode of atStatus!) expect(beforeWake!.has(inode), String(inode)).toBe(true); // the memory copied into early is the engine's now
      expect(progress.at(-1)).toMatchObject({ phase: 'done', bytesDone: snapshot.manifest.totalBytes });
      expect(fillInodes().size).toBe(0);
      expect(await ask(client)).toEqual(before);
    } finally {
      cache.close();
    }
  });

  it('the engine stops answering while its status is read and the copy runs: the copy is stopped and waited for, nothing is left', async () => {
    const { client, snapshot, cache, status, store } = await setup();
    try {
      const fds = openFds();
      native().setFault('chunk-delay', 100000, 20); // every chunk waits 20 ms: the copy is in flight when the status fails
      client.inject({ route: 'status' }); // the engine is gone: its first status read fails
      await expect(restoreEngine(snapshot, client, { tiers: { ram: cache }, transfer: {} })).rejects.toMatchObject({ code: 'E_ENGINE_HTTP' });
      native().setFault('chunk-delay', 0);
      expectNothingLeft(cache, snapshot.id, fds);
      // and the next restore goes through
      await cache.load(store, snapshot.manifest);
      expect((await restoreEngine(snapshot, client, { tiers: { ram: cache } })).tier).toBe('ram');
    } finally {
      cache.close();
    }
  });

  it('an engine that turns out awake is refused: the memory copied into goes, nothing is left', async () => {
    const { client, snapshot, cache, status, store } = await setup();
    try {
      await restoreEngine(snapshot, client, { tiers: { ram: cache } }); // awake now
      const fds = openFds();
      let atStatus: Set<number> | undefined;
      client.inject({ route: 'status', pass: true, times: Infinity, action: () => void (atStatus ??= fillInodes()) });
      await expect(restoreEngine(snapshot, client, { tiers: { ram: cache } })).rejects.toMatchObject({ code: 'E_ENGINE_STATE' });
      expect(atStatus!.size).toBeGreaterThan(0);
      expectNothingLeft(cache, snapshot.id, fds);
      await cache.load(store, snapshot.manifest);
    } finally {
      cache.close();
    }
  });

  it('a copy that fails mid-restore: the restore fails with it, the engine stays asleep, nothing is left, and the next restore works', async () => {
    const { client, before, snapshot, cache, store } = await setup();
    try {
      const fds = openFds();
      native().setFault('copy-fail', 1, 1); // the second copy of the restore fails
      await expect(restoreEngine(snapshot, client, { tiers: { ram: cache } })).rejects.toMatchObject({
        code: 'E_CUDA',
        message: expect.stringMatching(/injected fault: a copy of 'early-copy' failed/),
        details: { recovered: true },
      });
      const asleep = await client.wire.vsnapStatus();
      expect(asleep.sleeping).toBe(true);
      expect(asleep.ranks[0]!.weightsMapped).toBe(false);
      expectNothingLeft(cache, snapshot.id, fds);
      await cache.load(store, snapshot.manifest);
      expect((await restoreEngine(snapshot, client, { tiers: { ram: cache } })).tier).toBe('ram');
      expect(await ask(client)).toEqual(before);
    } finally {
      cache.close();
    }
  });
});
