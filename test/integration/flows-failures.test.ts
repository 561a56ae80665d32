import { afterEach, describe, expect, it } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { VsnapError } from '../../src/errors.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient, openFds, type Route } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function setup() {
  const engine = await startEngine();
  let stopping: Promise<void> | undefined;
  const e = { ...engine, stop: () => (stopping ??= engine.stop()) };
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  const resident = new GpuTier();
  cleanup.push(() => e.stop(), () => client.close(), () => resident.close());
  const store = await RegionStore.open(tempDir());
  const answer = (await askCapital(client, 8)).ids;
  const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
  await restoreEngine(snapshot, client);
  const fds = openFds();
  const ask = async () => (await askCapital(client, 8)).ids;
  return { e, client, resident, store, answer, fds, ask, snapshot };
}

const warn = { onWarning: () => undefined };

describe('a fault at each step of a suspend: the weights stay (or a snapshot holds them), nothing leaks', () => {
  for (const tier0 of [false, true]) {
    for (const route of ['status', 'export', 'complete', 'sleep'] as Route[]) {
      it(`${route} fails${tier0 ? ' (tier 0)' : ''}`, async () => {
        const { client, resident, store, answer, fds, ask } = await setup();
        await store.remove('ref'); // so the suspend has to capture (and probe) first
        client.inject({ route });
        const err = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, ...(tier0 ? { tiers: { gpu: resident } } : {}), ...warn }).catch((x: unknown) => x);
        expect(err).toBeInstanceOf(VsnapError);
        expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
        expect(await ask()).toEqual(answer); // its weights are untouched
        expect(resident.entries()).toEqual([]);
        expect(openFds()).toEqual(fds);
        const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, ...(tier0 ? { tiers: { gpu: resident } } : {}) });
        await restoreEngine(snapshot, client, tier0 ? { tiers: { gpu: resident } } : {});
        expect(await ask()).toEqual(answer);
      });
    }
    it(`the sleep's answer is lost after the engine slept${tier0 ? ' (tier 0)' : ''}: tier 0 lets go, the snapshot brings the weights back`, async () => {
      const { client, resident, store, answer, fds, ask, snapshot } = await setup();
      client.inject({ route: 'sleep', when: 'after' });
      await expect(suspendEngine(store, 'ref', client, { ...(tier0 ? { tiers: { gpu: resident } } : {}) })).rejects.toBeInstanceOf(VsnapError);
      expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
      expect(resident.entries()).toEqual([]);
      expect(openFds()).toEqual(fds);
      await restoreEngine(snapshot, client, tier0 ? { tiers: { gpu: resident } } : {});
      expect(await ask()).toEqual(answer);
    });
  }
});

// The two forms of a restore's targets: memory filled here while the engine's wake adopts it
// (describe, then a wake with adopt), or, for a plugin that cannot describe its regions while asleep,
// the engine's wake, then its export.
const TARGETS = { fill: ['status', 'describe', 'adopt', 'wakeKv', 'reset', 'complete'], wake: ['status', 'wake', 'export', 'wakeKv', 'reset', 'complete'] } as const;

describe.each(Object.keys(TARGETS) as Array<keyof typeof TARGETS>)('a fault at each step of a restore (targets: %s): the engine is left asleep (never slept if it never woke), the next restore works', (targets) => {
  for (const route of TARGETS[targets] as readonly Route[]) {
    for (const when of ['before', 'after'] as const) {
      it(`${route} fails (${when})`, async () => {
        const { client, store, answer, fds, ask, snapshot } = await setup();
        if (targets === 'wake') client.lack('describe');
        await suspendEngine(store, 'ref', client);
        client.inject({ route, when });
        client.calls.length = 0;
        const err = (await restoreEngine(snapshot, client, warn).catch((x: unknown) => x)) as VsnapError;
        expect(err).toBeInstanceOf(VsnapError);
        expect(client.calls).toContain(route); // the step was taken (and failed)
        if (route !== 'status') expect(err.details.recovered).toBe(true);
        if ((route === 'wake' || route === 'adopt' || route === 'describe') && when === 'before') expect(client.calls).not.toContain('sleep'); // it never woke
        const after = await client.wire.vsnapStatus();
        expect(after.sleeping).toBe(true);
        // Asleep means the weights let go: vLLM's executor ignores a sleep while the KV cache is
        // still asleep (vllm/v1/executor/abstract.py), so a half-woken engine is woken fully first.
        expect(after.ranks.map((r) => r.weightsMapped)).toEqual([false]);
        expect(openFds()).toEqual(fds);
        await restoreEngine(snapshot, client);
        expect(await ask()).toEqual(answer);
      });
    }
  }

  it('the engine stalls (SIGSTOP) mid-restore: the restore is aborted, the engine is put back to sleep once it answers again', async () => {
    const { e, client, store, answer, fds, ask, snapshot } = await setup();
    await suspendEngine(store, 'ref', client);
    const pid = e.process.pid!;
    const abort = new AbortController();
    client.inject({
      route: 'wakeKv',
      pass: true,
      action: () => {
        process.kill(pid, 'SIGSTOP');
        setTimeout(() => abort.abort(), 300).unref(); // the caller gives up while the engine does not answer
        setTimeout(() => process.kill(pid, 'SIGCONT'), 1500).unref();
      },
    });
    const err = (await restoreEngine(snapshot, client, { signal: abort.signal }).catch((x: unknown) => x)) as VsnapError;
    expect(err.code).toBe('E_ABORTED');
    expect(err.details.recovered).toBe(true);
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    expect(openFds()).toEqual(fds);
    await restoreEngine(snapshot, client);
    expect(await ask()).toEqual(answer);
  });
});
