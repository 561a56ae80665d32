import { afterEach, describe, expect, it, vi } from 'vitest';

import { restore as restoreCommand } from '../../src/cli/commands/engine.js';
import { rm as rmCommand } from '../../src/cli/commands/store.js';
import { Context, type Options } from '../../src/cli/context.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { ask, useEngines } from '../helpers/engines.js';
import { openFds } from '../helpers/faults.js';
import { holdAt } from '../helpers/failpoints.mjs';
import { tempDir } from '../helpers/tmp.js';

// `vsnap rm` (remove, then gc) racing a restore: the restore is held right after its manifest read
// (the pause point `snapshot.opened`), the rm runs there, then the restore goes on. The order is
// fixed by the pause, not by timing. A gc that tries the lock once (lockTimeoutMs 0) is refused
// while the restore holds the store; one with the default timeout waits for the restore to end.

const { engine } = useEngines();
let hold: ReturnType<typeof holdAt> | undefined;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  hold?.release();
  hold?.remove();
  hold = undefined;
  for (const c of cleanup.splice(0).reverse()) await c();
});

/** Descriptors this process holds on the store's lock files. */
const lockFds = (root: string): string[] => openFds().filter((f) => f === `${root}/.lock` || f === `${root}/.meta.lock`);

/** A `vsnap` command's context, as the command line makes it (run in this process, --json). */
const command = (name: string, args: string[], options: Options): Context => new Context(name, args, { ...options, json: true }, new AbortController().signal);

/** A reference engine, captured into a fresh store and suspended: ready for a restore. */
async function suspended() {
  const { e, client } = await engine();
  const store = await RegionStore.open(tempDir());
  const answer = await ask(client);
  const snap = await captureEngine(store, 'ref', client);
  await suspendEngine(store, 'ref', client);
  return { e, client, store, root: store.root, answer, id: snap.id };
}

describe('vsnap rm racing a restore', () => {
  it('a gc run between the restore reading its manifest and copying is refused (E_STORE_LOCKED); the restore copies every byte; no lock descriptor is left', async () => {
    const { client, store, root, answer, id } = await suspended();
    // one restore and suspend first, so what a restore keeps open for good (pools) is in the baseline
    await restoreEngine({ store, name: 'ref' }, client);
    await suspendEngine(store, 'ref', client);
    const fds = openFds();

    hold = holdAt('snapshot.opened');
    const restoring = restoreEngine({ store, name: 'ref' }, client);
    await hold.reached; // the restore has read the manifest; no blob is read yet
    const rm = await RegionStore.open(root, { lockTimeoutMs: 0 }); // `vsnap rm ref`, trying the lock once
    expect(await rm.remove('ref')).toEqual([id]);
    await expect(rm.gc()).rejects.toMatchObject({ code: 'E_STORE_LOCKED' });
    hold.release();

    const report = await restoring;
    expect(report).toMatchObject({ path: 'restored', tier: 'store' });
    expect(await ask(client)).toEqual(answer);
    expect(lockFds(root)).toEqual([]);
    expect(openFds()).toEqual(fds);
    expect((await rm.gc()).blobsRemoved).toBeGreaterThan(0); // once the restore is over, the rm's gc runs
    expect(await store.usage()).toEqual({ blobs: 0, bytes: 0 });
  });

  it('a gc that may wait (the default) runs once the restore has ended, and frees the removed blobs', async () => {
    const { client, store, root, answer, id } = await suspended();
    hold = holdAt('snapshot.opened');
    const order: string[] = [];
    const restoring = restoreEngine({ store, name: 'ref' }, client).then((r) => (order.push('restore'), r));
    await hold.reached;
    const rm = await RegionStore.open(root);
    expect(await rm.remove('ref')).toEqual([id]);
    const gc = rm.gc().then((r) => (order.push('gc'), r));
    hold.release();
    expect(await restoring).toMatchObject({ path: 'restored' });
    expect((await gc).blobsRemoved).toBeGreaterThan(0);
    expect(order).toEqual(['restore', 'gc']);
    expect(await ask(client)).toEqual(answer);
    expect(lockFds(root)).toEqual([]);
  });

  it('a restore that fails or is cancelled lets the store go on that path: a gc runs at once', async () => {
    const { client, store, root } = await suspended();
    const rm = await RegionStore.open(root, { lockTimeoutMs: 0 });
    // no such snapshot: the open fails under the lock
    await expect(restoreEngine({ store, name: 'nope' }, client)).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
    expect(lockFds(root)).toEqual([]);
    await expect(rm.gc()).resolves.toMatchObject({ blobsRemoved: 0 });
    // cancelled before it began
    await expect(restoreEngine({ store, name: 'ref' }, client, { signal: AbortSignal.abort() })).rejects.toMatchObject({ code: expect.stringMatching(/^E_/) });
    expect(lockFds(root)).toEqual([]);
    await expect(rm.gc()).resolves.toMatchObject({ blobsRemoved: 0 });
    // the engine is awake (restored once): refused after the snapshot was opened
    await restoreEngine({ store, name: 'ref' }, client);
    await expect(restoreEngine({ store, name: 'ref' }, client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE' });
    expect(lockFds(root)).toEqual([]);
    await expect(rm.gc()).resolves.toMatchObject({ blobsRemoved: 0 });
  });

  it("the SwapController's wake opens its snapshot under the store's lock too: an rm beside it cannot collect its blobs", async () => {
    const { client, store, root, answer, id } = await suspended();
    const controller = await SwapController.create({ store, engines: [{ name: 'ref', client, memoryBytes: 1e9 }], budgets: { 0: 2e9 }, recovery: 'fail' });
    cleanup.push(() => controller.close());
    expect(controller.states()[0]).toMatchObject({ state: 'asleep' });

    hold = holdAt('snapshot.opened');
    const leasing = controller.acquire('ref');
    await hold.reached;
    const rm = await RegionStore.open(root, { lockTimeoutMs: 0 });
    expect(await rm.remove('ref')).toEqual([id]);
    await expect(rm.gc()).rejects.toMatchObject({ code: 'E_STORE_LOCKED' });
    hold.release();

    const lease = await leasing;
    try {
      expect(await ask(lease.client)).toEqual(answer);
    } finally {
      lease.release();
    }
    expect(lockFds(root)).toEqual([]);
    expect((await rm.gc()).blobsRemoved).toBeGreaterThan(0);
  });

  it('`vsnap restore` reads the manifest under the lock too, and a `vsnap rm` beside it waits for the restore, then frees the blobs', async () => {
    const { e, client, root, answer } = await suspended();
    const printed = vi.spyOn(console, 'log').mockImplementation(() => undefined); // the commands' --json reports
    cleanup.push(() => printed.mockRestore());
    hold = holdAt('snapshot.opened');
    const order: string[] = [];
    const restoring = restoreCommand(command('restore', ['ref'], { store: root, engine: e.url, token: e.token })).then((code) => (order.push('restore'), code));
    await hold.reached;
    const probe = await RegionStore.open(root, { lockTimeoutMs: 0 });
    await expect(probe.gc()).rejects.toMatchObject({ code: 'E_STORE_LOCKED' }); // no gc can run now
    const removing = rmCommand(command('rm', ['ref'], { store: root })).then((code) => (order.push('rm'), code));
    hold.release();
    expect(await restoring).toBe(0);
    expect(await removing).toBe(0);
    expect(order).toEqual(['restore', 'rm']);
    expect(await ask(client)).toEqual(answer);
    expect(await probe.usage()).toEqual({ blobs: 0, bytes: 0 });
    expect(await probe.history('ref')).toEqual([]);
    expect(lockFds(root)).toEqual([]);
  });
});
