import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { restoreEngine } from '../../src/flows/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { tryLock } from '../../src/store/lock.js';
import { RegionStore } from '../../src/store/region-store.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

// `vsnap rm` (remove, then gc) racing a restore: the restore's manifest read and its copy must not
// straddle a gc. The interleaving is fixed by awaiting each step in order, not by timing.
const MiB = 1024 * 1024;
const open: HostRegion[] = [];
afterEach(() => {
  for (const r of open.splice(0)) r.close();
});
function region(fill: number): HostRegion {
  const r = HostRegion.create(MiB);
  open.push(r);
  if (fill) r.write(0, Buffer.alloc(MiB, fill));
  return r;
}
/** Whether gc could take the store's lock now (and gives it back at once). */
function gcCouldRun(root: string): boolean {
  const release = tryLock(join(root, '.lock'), true);
  release?.();
  return release !== undefined;
}

describe('vsnap rm racing a restore', () => {
  it('a snapshot removed and collected between the restore\'s open and its copy: gc waits, the restore copies every byte, then gc frees the blobs', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    const source = region(0x5a);
    await Snapshot.capture(store, 'a', { regions: [{ key: 'w', size: MiB, memory: source.memory }] });

    const snap = await Snapshot.open(store, 'a'); // 1. the restore reads the manifest
    const rm = await RegionStore.open(root, { lockTimeoutMs: 600_000 }); // 2. `vsnap rm a`, as another process would
    expect(await rm.remove('a')).toEqual([snap.id]);
    expect(gcCouldRun(root)).toBe(false); // the open holds gc off
    const gc = rm.gc();
    const target = region(0);
    const result = await snap.restore({ regions: [{ key: 'w', size: MiB, memory: target.memory }] }); // 3. the copy
    expect(result.bytes).toBe(MiB);
    expect(target.read(0, MiB).equals(Buffer.alloc(MiB, 0x5a))).toBe(true);
    expect(await gc).toEqual({ blobsRemoved: 1, bytesFreed: MiB }); // 4. gc, once the restore settled
  });

  it('the hold ends when the restore settles, failed or not', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    await Snapshot.capture(store, 'a', { regions: [{ key: 'w', size: MiB, memory: region(1).memory }] });
    const snap = await Snapshot.open(store, 'a');
    expect(gcCouldRun(root)).toBe(false);
    await expect(snap.restore({ regions: [{ key: 'other', size: MiB, memory: region(0).memory }] })).rejects.toMatchObject({ code: 'E_MANIFEST_MISMATCH' });
    expect(gcCouldRun(root)).toBe(true);
  });

  it('an open that fails (no such snapshot) holds nothing', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    await expect(Snapshot.open(store, 'nope')).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    expect(gcCouldRun(root)).toBe(true);
  });

  it('an engine restore that ends before its copy (no engine answers) lets gc run at once, not after a delay', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    await Snapshot.capture(store, 'a', { regions: [{ key: 'w', size: MiB, memory: region(1).memory }] });
    const client = new EngineClient({ baseUrl: `http://127.0.0.1:${await freePort()}` }); // nothing listens there
    try {
      await expect(restoreEngine({ store, name: 'a' }, client)).rejects.toMatchObject({ code: expect.stringMatching(/^E_/) });
    } finally {
      await client.close();
    }
    expect(gcCouldRun(root)).toBe(true);
  });

  it('a snapshot whose hold is let go without a restore holds gc off no longer', async () => {
    const root = tempDir();
    const store = await RegionStore.open(root);
    await Snapshot.capture(store, 'a', { regions: [{ key: 'w', size: MiB, memory: region(1).memory }] });
    const snap = await Snapshot.open(store, 'a');
    expect(gcCouldRun(root)).toBe(false);
    snap.releaseHold();
    expect(gcCouldRun(root)).toBe(true);
  });
});
