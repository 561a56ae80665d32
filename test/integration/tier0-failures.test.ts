import { closeSync, openSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { VsnapError } from '../../src/errors.js';
import { FdReceiver } from '../../src/ipc/fd-receiver.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient, openFds, unhandledDuring } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function setup() {
  const engine = await startEngine();
  let stopping: Promise<void> | undefined; // stop() once: a second one would wait for an exit already seen
  const e = { ...engine, stop: () => (stopping ??= engine.stop()) };
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  const resident = new GpuTier();
  cleanup.push(() => e.stop(), () => client.close(), () => resident.close());
  const store = await RegionStore.open(tempDir());
  const before = (await askCapital(client, 8)).ids;
  // one full round first, so what stays open for good (pools, the addon) is in the baseline
  const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, tiers: { gpu: resident } });
  await restoreEngine(s.snapshot, client, { tiers: { gpu: resident } });
  const fds = openFds();
  const suspend = async () => (await suspendEngine(store, 'ref', client, { tiers: { gpu: resident } })).snapshot;
  return { e, client, resident, store, before, fds, suspend };
}

describe('tier-0 failure paths: nothing stranded, leaked or left unhandled', () => {
  it('a tier-0 wake the engine never saw: no sleep on the engine that never woke, tier 0 released, restored from the store', async () => {
    const { client, resident, before, fds, suspend } = await setup();
    const snap = await suspend();
    client.inject({ route: 'adopt', when: 'before' });
    client.calls.length = 0;
    const run = await unhandledDuring(() => restoreEngine(snap, client, { onWarning: () => undefined, tiers: { gpu: resident } }));
    expect(run.error).toBeUndefined();
    expect(run.unhandled).toEqual([]);
    expect(run.value!.tier).toBe('store');
    const failedAt = client.calls.indexOf('adopt');
    expect(client.calls.slice(failedAt)).not.toContain('sleep'); // it never woke: nothing to put back to sleep
    expect(resident.entries()).toEqual([]);
    expect((await askCapital(client, 8)).ids).toEqual(before);
    expect(openFds()).toEqual(fds);
  });

  it('a tier-0 wake whose answer was lost after the engine adopted: put back to sleep, then restored from the store', async () => {
    const { client, resident, before, fds, suspend } = await setup();
    const snap = await suspend();
    client.inject({ route: 'adopt', when: 'after' });
    const run = await unhandledDuring(() => restoreEngine(snap, client, { onWarning: () => undefined, tiers: { gpu: resident } }));
    expect(run.error).toBeUndefined();
    expect(run.unhandled).toEqual([]);
    expect(run.value!.tier).toBe('store');
    expect(resident.entries()).toEqual([]);
    expect((await askCapital(client, 8)).ids).toEqual(before);
    expect(openFds()).toEqual(fds);
  });

  it('the KV-cache wake fails after a tier-0 adopt: back to sleep, restored from the store', async () => {
    const { client, resident, before, fds, suspend } = await setup();
    const snap = await suspend();
    client.inject({ route: 'wakeKv' });
    const report = await restoreEngine(snap, client, { onWarning: () => undefined, tiers: { gpu: resident } });
    expect(report.tier).toBe('store');
    expect(resident.entries()).toEqual([]);
    expect((await askCapital(client, 8)).ids).toEqual(before);
    expect(openFds()).toEqual(fds);
  });

  it('the engine dies during a tier-0 wake: a coded error, tier 0 released, no descriptor left', async () => {
    const { e, client, resident, fds, suspend } = await setup();
    const snap = await suspend();
    client.inject({ route: 'adopt', when: 'before', action: () => e.stop() });
    const run = await unhandledDuring(() => restoreEngine(snap, client, { onWarning: () => undefined, tiers: { gpu: resident } }));
    expect(run.unhandled).toEqual([]);
    expect(run.error).toBeInstanceOf(VsnapError);
    expect((run.error as VsnapError).code).toBe('E_ENGINE_UNREACHABLE');
    expect((run.error as VsnapError).details.recovered).toBe(false);
    expect((run.error as VsnapError).message).toMatch(/no longer answers/);
    expect(resident.entries()).toEqual([]);
    expect(openFds()).toEqual(fds);
  });

  it('closing an FdReceiver withdraws pending offers: their duplicated descriptors are closed, the waits reject', async () => {
    const mine = [openSync('/dev/null', 'r'), openSync('/dev/null', 'r')];
    const fds = openFds();
    const receiver = await FdReceiver.listen();
    const listening = openFds().length;
    const offer = receiver.offer({ x: 1 }, mine);
    const settled = offer.taken.catch((err: unknown) => err);
    expect(openFds().length).toBe(listening + 2); // the listener's duplicates
    receiver.close();
    expect(((await settled) as VsnapError).code).toBe('E_CLOSED');
    expect(openFds()).toEqual(fds);
    for (const fd of mine) closeSync(fd);
  });
});
