import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { engineControl } from '../../src/engine/control.js';
import { VsnapError } from '../../src/errors.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import type { QueuedRequestsPolicy } from '../../src/engine/engine-client.js';
import { RegionStore } from '../../src/store/region-store.js';
import { runCli } from '../helpers/cli.js';
import type { TestEngine } from '../helpers/engine.js';
import { ask, useEngines } from '../helpers/engines.js';
import { tempDir } from '../helpers/tmp.js';

// What vLLM main enforces and the reference engine now does too (issue 22), each with the SDK
// driven into it: the KV-cache release under queued requests, the executor's sleeping tags,
// VLLM_USE_RUST_FRONTEND, --enable-cumem-allocator. The weight-sync API is driven by
// live-weights.test.ts (test/helpers/engine.ts syncWeights).

const { engine } = useEngines();


// The engine's own tier 0 through the flows (tiers.engine); it needs no snapshot.
async function keepInEngine(client: EngineClient, queued?: QueuedRequestsPolicy) {
  return suspendEngine(await RegionStore.open(tempDir()), 'kept', client, { tiers: { engine: queued ? { queued } : true } });
}
async function resumeKept(client: EngineClient) {
  return restoreEngine({ store: await RegionStore.open(tempDir()), name: 'kept' }, client, { tiers: { engine: true } });
}

/** vLLM's gauge of requests waiting in the scheduler (GET /metrics). */
async function waiting(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return Number(/^vllm:num_requests_waiting\{[^}]*\} (\d+)$/m.exec(text)?.[1] ?? Number.NaN);
}

/** Pauses the engine (as an RL trainer would), then sends a completion that waits in its queue. */
async function queueARequest(e: TestEngine, client: EngineClient) {
  await client.wire.sleep({ level: 0, mode: 'keep' });
  const pending = client.completions({ prompt: 'queued while paused', max_tokens: 4 }).then(
    (r) => ({ ok: true as const, finish: (r.raw as { choices: Array<{ finish_reason: string }> }).choices[0]!.finish_reason, tokens: r.text.split(' ').filter(Boolean).length }),
    (err: unknown) => ({ ok: false as const, err }),
  );
  while ((await waiting(e.url)) !== 1) await new Promise((r) => setImmediate(r)); // until the engine reports it queued
  return { pending }; // wrapped: an async function returning the promise itself would wait for it
}

describe('the engine releases its KV cache only with nothing queued (vllm/v1/engine/core.py release_kv_cache_memory)', () => {
  for (const devMode of [false, true]) {
    const via = devMode ? 'the dev routes' : 'the plugin routes';
    it(`${via}: queued 'wait' serves the queued request, then releases; never left paused`, async () => {
      const { e, client } = await engine(devMode ? { env: { VSNAP_REF_NO_BUILD_APP: '1' } } : {});
      const before = await ask(client);
      const { pending } = await queueARequest(e, client);
      const r = await keepInEngine(client); // default: wait
      expect(r.tier).toBe('engine');
      expect((await client.wire.routeMechanism()).mechanism === null).toBe(devMode);
      expect(await pending).toEqual({ ok: true, finish: 'length', tokens: 4 }); // served before the release
      expect(await waiting(e.url)).toBe(0);
      await resumeKept(client);
      expect(await ask(client)).toEqual(before);
    });

    it(`${via}: queued 'abort' aborts it`, async () => {
      const { e, client } = await engine(devMode ? { env: { VSNAP_REF_NO_BUILD_APP: '1' } } : {});
      const { pending } = await queueARequest(e, client);
      await keepInEngine(client, 'abort');
      expect(await pending).toEqual({ ok: true, finish: 'abort', tokens: 0 });
      await resumeKept(client);
      expect((await client.completions({ prompt: 'after', max_tokens: 2, logprobs: 1 })).tokenIds).toHaveLength(2);
    });
  }

  it("vLLM's own route refuses with a request queued; the SDK resumes the engine after a failed release", async () => {
    const { e, client } = await engine();
    const { pending } = await queueARequest(e, client);
    const err = await client.wire.releaseKvCacheMemory().catch((x: unknown) => x); // what the plugin did before: pause keep, release
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).details.status).toBe(500);
    expect((err as Error).message).toMatch(/requires a completed pause first/);
    expect(await client.wire.isSleeping()).toBe(true); // vLLM leaves it paused, the request still queued
    // The SDK's dev-route path resumes after a failure: a release that cannot succeed (the memory asleep).
    await client.wire.wakeUp({ tags: ['scheduling'] });
    expect(await pending).toMatchObject({ ok: true, finish: 'length' });
    await client.wire.sleep({ level: 1 });
    const { control } = await engineControl(client);
    await expect(control.releaseKvCache()).rejects.toThrow(/resident/);
    expect(await client.wire.isSleeping()).toBe(true); // asleep (level 1), as before: a resume wakes no memory
    await client.wire.wakeUp();
    expect(await client.wire.isSleeping()).toBe(false);
  });
});

describe("the executor's sleeping tags (vllm/v1/executor/abstract.py)", () => {
  it('a sleep while asleep does nothing; a wake naming a tag that is not asleep is skipped whole', async () => {
    const { client } = await engine({ args: ['--sleep-mode-offload-cudagraph'] });
    const before = await ask(client);
    await client.wire.sleep({ level: 2 });
    await client.wire.wakeUp({ tags: ['weights'] });
    await client.wire.sleep({ level: 2 }); // ignored: the KV cache is still asleep
    expect((await client.wire.vsnapStatus()).ranks[0]!.weightsMapped).toBe(true);
    await client.wire.wakeUp({ tags: ['kv_cache', 'cudagraph'] }); // 'cudagraph' is not an executor tag: nothing wakes
    expect((await client.wire.vsnapStatus()).ranks[0]!.asleepTags).toEqual(['kv_cache']);
    expect(await client.wire.isSleeping()).toBe(true);
    await client.wire.wakeUp({ tags: ['kv_cache'] }); // the graph pool came back with the first wake
    expect(await client.wire.isSleeping()).toBe(false);
    expect((await client.wire.vsnapStatus()).ranks[0]!.asleepTags).toEqual([]);
    await client.wire.resetPrefixCache();
    expect(await ask(client)).not.toEqual(before); // the weights woke empty (level 2, nothing restored)
  });
});

describe('VLLM_USE_RUST_FRONTEND=1: no FastAPI app, so no endpoint plugin', () => {
  it('the plugin says so at start-up, the SDK says what to do, vsnap doctor names it', async () => {
    const { e, client } = await engine({ env: { VLLM_USE_RUST_FRONTEND: '1' } });
    expect(e.stderr()).toMatch(/VLLM_USE_RUST_FRONTEND=1.*no FastAPI app/);
    expect((await client.completions({ prompt: 'hi', max_tokens: 2, logprobs: 1 })).tokenIds).toHaveLength(2); // it serves
    const err = await captureEngine(await RegionStore.open(tempDir()), 'ref', client).catch((x: unknown) => x);
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as Error).message).toMatch(/without VLLM_USE_RUST_FRONTEND/);
    expect((await client.wire.routeMechanism()).detail).toMatch(/VLLM_USE_RUST_FRONTEND=1/);
    const doctor = await runCli(['doctor', '--store', join(tempDir(), 's'), '--engine', e.url], { VSNAP_TOKEN: e.token });
    expect(doctor.code).not.toBe(0);
    expect(doctor.stdout + doctor.stderr).toMatch(/VLLM_USE_RUST_FRONTEND/);
  });
});

describe('--enable-cumem-allocator puts the weights in the pool without sleep mode', () => {
  it('the status reports sleep mode from the configuration, and the SDK refuses to suspend such an engine', async () => {
    const { client } = await engine({ sleepMode: false, args: ['--enable-cumem-allocator'] });
    const rank = (await client.wire.vsnapStatus()).ranks[0]!;
    expect(rank).toMatchObject({ sleepMode: false, cumemAllocator: true });
    const err = await captureEngine(await RegionStore.open(tempDir()), 'ref', client).catch((x: unknown) => x);
    expect((err as VsnapError).code).toBe('E_ENGINE_STATE');
    expect((err as Error).message).toMatch(/--enable-cumem-allocator.*--enable-sleep-mode/);
  });
});
