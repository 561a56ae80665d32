import { describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController, type SwapEvent } from '../../src/swap/controller.js';
import { ask, useEngines } from '../helpers/engines.js';
import { tempDir } from '../helpers/tmp.js';

// The reference engine shaped like vLLM 0.33 (API server and engine core in two processes,
// endpoint plugins, handle-type modes; see test/fixtures/engine/README.md) and its older switches.

const { engine } = useEngines();


// The engine's own tier 0 through the flows (tiers.engine): no snapshot is needed, so none is in the store.
async function keepInEngine(client: EngineClient, check?: object) {
  return suspendEngine(await RegionStore.open(tempDir()), 'kept', client, { tiers: { engine: check ? { check } : true } });
}
async function resumeKept(client: EngineClient, expected?: import('../../src/manifest/types.js').ExpectedResponse) {
  return restoreEngine({ store: await RegionStore.open(tempDir()), name: 'kept' }, client, { tiers: { engine: expected ? { expected } : true } });
}

async function roundTrip(client: EngineClient): Promise<void> {
  const store = await RegionStore.open(tempDir());
  const before = await ask(client);
  const snap = await captureEngine(store, 'ref', client);
  await suspendEngine(store, 'ref', client);
  expect(await ask(client).catch(() => 'refused')).toBe('refused'); // asleep: no answer
  await restoreEngine(snap, client);
  expect(await ask(client)).toEqual(before);
}

describe('wake semantics before vLLM PR #52514', () => {
  it('a wake maps every allocation of its tags, awake or not: a restore wakes the rest by name, and works', async () => {
    // A wake of all tags after the weights woke would map them again: the driver refuses, and
    // old vLLM unmaps what that call had mapped (vllm/device_allocator/cumem.py at 010c2112).
    const { client } = await engine({ env: { VSNAP_REF_WAKE_ALL: '1' } });
    await roundTrip(client);
    // What a restore must not do: once the weights woke, a wake of every tag (the executor still
    // asleep, for the KV cache) maps them a second time.
    await client.wire.vsnapSleep({ level: 2 });
    await client.wire.vsnapWake({ tags: ['weights'] });
    await expect(client.wire.vsnapWake({})).rejects.toThrow(/mapped already/);
  });
});

describe('routes: how they get onto the engine, and saying so', () => {
  it('newer vLLM: the endpoint plugin, with the engine client from init_state', async () => {
    const { client } = await engine({ devMode: false });
    const s = await client.wire.vsnapStatus();
    expect(s.routes).toEqual({ mechanism: 'endpoint_plugins', detail: "vllm.endpoint_plugins entry point 'vsnap'" });
    expect(s.features).toEqual({ releaseKvCache: true });
    expect(await client.wire.routeMechanism()).toMatchObject({ mechanism: 'endpoint_plugins', devRoutes: false });
    await roundTrip(client); // no dev mode needed
  });

  it('older vLLM: a wrapped build_app where it is defined and called', async () => {
    const { client } = await engine({ devMode: false, env: { VSNAP_REF_LEGACY_APP: '1' } });
    expect((await client.wire.vsnapStatus()).routes?.mechanism).toBe('build_app wrap');
  });

  it('VLLM_PLUGINS is matched exactly: a near miss loads nothing, and the client says why there are no routes', async () => {
    const { client } = await engine({ env: { VLLM_PLUGINS: 'other, vsnap' } });
    const r = await client.wire.routeMechanism();
    expect(r).toMatchObject({ mechanism: null, devRoutes: true });
    expect(r.detail).toMatch(/VLLM_PLUGINS to name vsnap exactly/);
    const both = await engine({ env: { VLLM_PLUGINS: 'other,vsnap' } });
    expect((await both.client.wire.vsnapStatus()).routes?.mechanism).toBe('endpoint_plugins');
  });
});

describe('the kinds of weights memory', () => {
  for (const [mode, kind, rehomed] of [
    ['none', 'none', true],
    ['fabric-posix', 'posix-fd', false],
    ['fabric', 'fabric', true],
  ] as const) {
    it(`${mode}: ${kind} memory, ${rehomed ? 'rehomed at load' : 'exported as it is'}; capture, suspend and restore work`, async () => {
      const { client } = await engine({ env: { VSNAP_REF_HANDLE_TYPES: mode } });
      const rank = (await client.wire.vsnapStatus()).ranks[0]!;
      expect(rank.weightsMemory).toEqual({ [kind]: rank.regions });
      expect((rank as { rehome?: { rehomed: number } }).rehome?.rehomed).toBe(rehomed ? rank.regions : 0);
      await roundTrip(client);
    });
  }
});

describe('nothing the bridge does breaks the engine', () => {
  it('ROCm-shaped handles: the bridge steps aside with the reason, the engine loads, serves, sleeps and wakes', async () => {
    const { client } = await engine({ env: { VSNAP_REF_ROCM_HANDLES: '1' } });
    const before = await ask(client);
    const rank = (await client.wire.vsnapStatus()).ranks[0]!;
    expect(rank.supported).toBe(false);
    expect(rank.unsupportedReason).toMatch(/ROCm/);
    await client.wire.sleep({ level: 1 });
    await client.wire.wakeUp();
    expect(await ask(client)).toEqual(before);
    const err = await captureEngine(await RegionStore.open(tempDir()), 'ref', client).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as Error).message).toMatch(/disabled/);
  });
});

describe('vLLM 0.33 details', () => {
  it('--sleep-mode-offload-cudagraph: the cudagraph pool is not weights, and a level-2 suspend and restore keep it right', async () => {
    const { client } = await engine({ args: ['--sleep-mode-offload-cudagraph'] });
    const rank = (await client.wire.vsnapStatus()).ranks[0]!;
    expect(rank.otherTags).toEqual(['cudagraph', 'kv_cache']);
    const plain = await engine();
    expect(rank.regions).toBe((await plain.client.wire.vsnapStatus()).ranks[0]!.regions); // same weights regions
    expect(await ask(client)).not.toEqual(await ask(plain.client)); // the answer reads the graph pool
    await roundTrip(client);
  });

  it('the device ordinal is worker.device.index, not local_rank', async () => {
    const { client } = await engine({ env: { VSNAP_REF_LOCAL_RANK: '3', VSNAP_REF_DEVICE_INDEX: '0' } });
    expect((await client.wire.vsnapStatus()).ranks[0]!.device.ordinal).toBe(0);
  });

  it('the worker runs in a process of its own (plugins loaded there too), results serialised', async () => {
    const { e, client } = await engine();
    const rank = (await client.wire.vsnapStatus()).ranks[0]!;
    expect(rank.pid).not.toBe(e.process.pid);
    const err = await client.wire.collectiveRpc('_pool', { args: ['weights'] }).catch((x: unknown) => x); // returns a context manager: not plain data
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).details.status).toBe(500);
    expect((err as Error).message).toMatch(/cannot be serialised/);
  });
});

describe("the engine's own weight-resident suspend (release_kv_cache_memory)", () => {
  it('through the plugin routes: weights stay mapped, the KV cache comes back, same answer', async () => {
    const { client } = await engine({ devMode: false });
    const r = await keepInEngine(client, { prompt: 'The capital of France is', maxTokens: 8 });
    expect(r.tier).toBe('engine');
    expect(r.snapshot).toBeUndefined();
    const asleep = await client.wire.vsnapStatus();
    expect(asleep.sleeping).toBe(true);
    expect(asleep.ranks[0]!.weightsMapped).toBe(true); // nothing of the weights was released
    await expect(keepInEngine(client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE' });
    expect(await resumeKept(client, r.expected!)).toMatchObject({ tier: 'engine', route: 'kept', bytes: 0 }); // the tier that kept them
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    // the recorded check is the prefill check: a prompt logprob off by one part in a million fails the resume
    expect(r.expected!.promptLogprobs).toHaveLength('The capital of France is'.length - 1);
    const again = await keepInEngine(client, {});
    const tampered = { ...again.expected!, promptLogprobs: again.expected!.promptLogprobs!.map((x, i) => (i === 5 ? x + 2 ** -20 : x)) };
    await expect(resumeKept(client, tampered)).rejects.toMatchObject({ code: 'E_RESPONSE_MISMATCH', details: { difference: expect.stringMatching(/^prompt logprobs differ/) } });
  });

  it('through the dev routes, and refused cleanly where the engine has no such route', async () => {
    const { client } = await engine({ env: { VSNAP_REF_NO_BUILD_APP: '1' } });
    const before = await ask(client);
    await expect(client.wire.releaseKvCacheMemory()).rejects.toMatchObject({ code: 'E_ENGINE_HTTP' }); // needs a pause first
    const r = await keepInEngine(client);
    expect(r.tier).toBe('engine');
    expect(await client.wire.routeMechanism()).toMatchObject({ mechanism: null, devRoutes: true }); // driven through the dev routes
    expect(await client.wire.isSleeping()).toBe(true);
    await resumeKept(client);
    expect(await ask(client)).toEqual(before);

    const old = await engine({ env: { VSNAP_REF_NO_BUILD_APP: '1', VSNAP_REF_LEGACY_ROUTES: '1' } });
    await expect(keepInEngine(old.client)).rejects.toMatchObject({ code: 'E_ENGINE_STATE' });
  });
});

describe('SwapController with the engine keeping its weights (option)', () => {
  it('suspend keepWeightsInEngine: no snapshot needed, counted as awake, restore resumes it with the same answer', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const GB = 1e9;
    const controller = await SwapController.create({ store, engines: [{ name: 'a', client, memoryBytes: 12 * GB, asleepBytes: 1 * GB }], budgets: { 0: 20 * GB } });
    try {
      await controller.restore('a');
      const before = await ask(client);
      const events: SwapEvent[] = [];
      controller.on('swap', (e: SwapEvent) => events.push(e));
      await expect(controller.suspend('a')).rejects.toMatchObject({ code: 'E_NOT_RESTORABLE' }); // no snapshot: a plain suspend refuses
      await controller.suspend('a', { keepWeightsInEngine: true });
      expect(controller.states()[0]!.state).toBe('asleep');
      expect(controller.usage()[0]).toBe(12 * GB);
      const status = await client.wire.vsnapStatus();
      expect(status.sleeping).toBe(true);
      expect(status.ranks[0]!.weightsMapped).toBe(true);
      await controller.restore('a');
      expect(await ask(client)).toEqual(before);
      expect(events.map((e) => [e.action, e.tier ?? null])).toEqual([['suspend', null], ['restore', 'engine']]);
      expect(await store.current('a')).toBeFalsy(); // nothing was captured
    } finally {
      await controller.close();
    }
  });
});
