// GPU suite, router (device only): two reference engines of ~2.4 GiB on one GPU, a budget that
// fits one, and alternating requests through the HTTP agent: every request swaps. Serial swaps
// (overlap off), and overlapped ones: with 7 GiB the new engine's weights fit beside the old one
// (4 GiB accounted each), so each swap is one SwapController step running both at once.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { request } from 'undici';

import { cudaStatus, EngineClient, RamTier, RegionStore, SwapController, type SwapEvent } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { SwapAgent } from '../../src/serve/index.js';
import { startEngine, type TestEngine } from '../helpers/engine.js';

const GiB = 1024 ** 3;
const MODEL_ARGS = ['--layers', '18', '--hidden', '2048'];

function summary(values: number[]): string {
  const v = [...values].sort((a, b) => a - b);
  const q = (p: number) => v[Math.min(v.length - 1, Math.floor(p * v.length))]!;
  return `n=${v.length} min ${(v[0]! * 1000).toFixed(0)} ms, median ${(q(0.5) * 1000).toFixed(0)} ms, p90 ${(q(0.9) * 1000).toFixed(0)} ms, max ${(v.at(-1)! * 1000).toFixed(0)} ms`;
}

describe('GPU: one H200 time-shared by two engines through the agent', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  const engines: Array<{ e: TestEngine; client: EngineClient; name: string; answer?: string }> = [];
  let dir: string;

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-swap-'));
    for (const seed of [1, 2]) {
      const e = await startEngine({ device: 'cuda', seed, model: `model-${seed}`, args: MODEL_ARGS });
      const client = new EngineClient({ baseUrl: e.url, token: e.token });
      const answer = (await client.completions({ prompt: 'Hello', max_tokens: 8 })).text;
      engines.push({ e, client, name: `model-${seed}`, answer });
    }
  });

  after(async () => {
    for (const x of engines) {
      await x.client.close();
      await x.e.stop();
    }
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  for (const [tier, overlap] of [['store', false], ['ram', false], ['ram', true]] as const) {
    it(`alternating requests, each a swap (restores from the ${tier === 'ram' ? 'RAM tier' : 'page cache'}${overlap ? ', overlapped' : ''})`, async () => {
      const store = await RegionStore.open(join(dir, 'store'));
      const cache = tier === 'ram' ? await RamTier.create({ budgetBytes: 6 * GiB }) : undefined;
      const controller = await SwapController.create({
        store,
        ...(cache ? { tiers: { ram: cache } } : {}),
        engines: engines.map((x) => ({ name: x.name, client: x.client, memoryBytes: 4 * GiB })),
        budgets: { 0: (overlap ? 7 : 6) * GiB },
        overlap,
      });
      const agent = await SwapAgent.listen({ controller, store });
      const restores: SwapEvent[] = [];
      const suspends: SwapEvent[] = [];
      controller.on('swap', (e: SwapEvent) => (e.action === 'restore' ? restores : suspends).push(e));
      try {
        const walls: number[] = [];
        for (let i = 0; i < 20; i++) {
          const x = engines[i % 2]!;
          const started = performance.now();
          const r = await request(`${agent.url}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: x.name, prompt: 'Hello', max_tokens: 8, temperature: 0 }),
          });
          const body = (await r.body.json()) as { choices: Array<{ text: string }> };
          walls.push((performance.now() - started) / 1000);
          assert.equal(r.statusCode, 200);
          assert.equal(body.choices[0]!.text, x.answer, `${x.name} answered as itself`);
        }
        const measured = restores.filter((e) => e.tier === tier);
        const label = `${tier}${overlap ? ', overlapped' : ''}`;
        console.log(`[${label}] restore (wake..expected response): ${summary(measured.map((e) => e.seconds))}`);
        console.log(`[${label}] suspend: ${summary(suspends.map((e) => e.seconds))}`);
        console.log(`[${label}] request wall time incl. swap: ${summary(walls)}`);
        const hydrate = measured.map((e) => e.phases!.hydrate!);
        console.log(`[${label}] hydrate phase: ${summary(hydrate)}`);
        assert.ok(measured.length >= 15, `${measured.length} restores from ${tier}`);
        // overlapped: every restore after the first waited for the other engine's sleep before its KV wake
        const overlapped = measured.filter((e) => e.phases!.awaitRoom !== undefined).length;
        if (overlap) assert.ok(overlapped >= 15, `${overlapped} of ${measured.length} restores overlapped`);
        else assert.equal(overlapped, 0);
      } finally {
        await agent.close();
        await controller.close();
        cache?.close();
      }
    });
  }
});
