import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { restoreEngineWith } from '../../src/flows/restore.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { startEngine, type EngineOptions, type TestEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// The expected-response check after a restore, in its default form (the prompt scored with its
// log-probabilities plus one generated token: one forward pass), against the two faults it exists
// for: state outside the snapshot (the FlashInfer-like workspace) and a weights byte wrong where
// no digest looked. CPU reference engine (host memory, hash model). test/gpu/check.gpu.test.ts
// runs the same cases on the GPU transformer.

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

async function engine(options: EngineOptions = {}) {
  const e = await startEngine(options);
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  return client;
}

const PROMPT = 'The capital of France is';
const quiet = { onWarning: () => undefined };

describe('the prefill check (CPU reference engine)', () => {
  it('the completions route scores the prompt the way vLLM does (echo + logprobs, prompt_logprobs)', async () => {
    const client = await engine();
    const echo = await client.completions({ prompt: PROMPT, max_tokens: 1, logprobs: 1, echo: true });
    const raw = echo.raw as { choices: Array<{ text: string; logprobs: { token_logprobs: Array<number | null> }; prompt_logprobs: unknown[] }>; usage: { prompt_tokens: number } };
    const ids = [...Buffer.from(PROMPT)];
    expect(raw.usage.prompt_tokens).toBe(ids.length);
    expect(echo.tokenIds!.slice(0, ids.length)).toEqual(ids); // the prompt tokens first, then the generated one
    expect(echo.tokenIds).toHaveLength(ids.length + 1);
    expect(raw.choices[0]!.logprobs.token_logprobs[0]).toBeNull(); // no logprob for the first prompt token
    expect(raw.choices[0]!.text.startsWith(PROMPT)).toBe(true);
    expect(raw.choices[0]!.prompt_logprobs[0]).toBeNull();
    expect(raw.choices[0]!.prompt_logprobs[1]).toEqual({ [String(ids[1])]: { logprob: raw.choices[0]!.logprobs.token_logprobs[1], rank: null, decoded_token: `token_id:${ids[1]}` } });
    // the generated token is the one a plain completion gives
    const plain = await client.completions({ prompt: PROMPT, max_tokens: 1, logprobs: 1 });
    expect(echo.tokenIds!.slice(ids.length)).toEqual(plain.tokenIds);
    expect(echo.logprobs!.slice(ids.length)).toEqual(plain.logprobs);
    // echo without generation: the prompt only, as vLLM
    const only = await client.completions({ prompt: PROMPT, max_tokens: 0, logprobs: 1, echo: true });
    expect(only.tokenIds).toEqual(ids);
  });

  it('catches the FlashInfer-like workspace: the restore fails with E_RESPONSE_MISMATCH, the engine back asleep', async () => {
    const client = await engine({ env: { VSNAP_REF_ATTENTION: 'FLASHINFER' } });
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'fi', client, quiet);
    expect(snap.manifest.data.expectedResponse).toMatchObject({ maxTokens: 1, promptLogprobs: expect.any(Array) });
    await suspendEngine(store, 'fi', client, quiet);
    const err = await restoreEngine(snap, client, quiet).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_RESPONSE_MISMATCH', details: { difference: expect.stringMatching(/^prompt logprobs differ/) } });
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
  });

  it('catches one flipped weights byte after the restore (any region), and passes once the snapshot puts it back', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'flip', client);
    const flips: Array<[string, number]> = [
      ['model.embed_tokens.weight', 0],
      ['model.layers.3.mlp.scales', 1001],
      ['lm_head.bias', 1023],
    ];
    for (const [name, offset] of flips) {
      await suspendEngine(store, 'flip', client);
      let flipped: unknown;
      const beforeCheck = async () => void (flipped = await client.wire.collectiveRpc('flip_weights_byte', { args: [name, offset] }));
      const err = await restoreEngineWith(snap, client, {}, { beforeCheck }).catch((e: unknown) => e);
      expect(flipped, name).toHaveLength(1); // one rank flipped one byte
      expect(err, name).toMatchObject({ code: 'E_RESPONSE_MISMATCH' });
      expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    }
    // the same restore without the flip passes: the check fails for the byte, nothing else
    const report = await restoreEngine(snap, client);
    expect(report.phases.expectedResponse).toBeGreaterThan(0);
  });

  it("the controller's captures record each engine's configured check", async () => {
    const store = await RegionStore.open(tempDir());
    const one = await engine({ seed: 1, model: 'model-1' });
    const two = await engine({ seed: 2, model: 'model-2' });
    const controller = await SwapController.create({
      store,
      engines: [
        { name: 'model-1', client: one, memoryBytes: 10e9, check: { mode: 'decode', maxTokens: 3 } },
        { name: 'model-2', client: two, memoryBytes: 10e9, check: { maxTokens: 2 } },
      ],
      budgets: { 0: 30e9 },
    });
    try {
      await controller.suspend('model-1', { captureIfNeeded: true });
      await controller.suspend('model-2', { captureIfNeeded: true });
    } finally {
      await controller.close();
    }
    const decode = (await store.current('model-1'))!.data.expectedResponse!;
    expect(decode).toMatchObject({ maxTokens: 3, tokenIds: [expect.any(Number), expect.any(Number), expect.any(Number)] });
    expect(decode.promptLogprobs).toBeUndefined();
    const prefill = (await store.current('model-2'))!.data.expectedResponse!;
    expect(prefill).toMatchObject({ maxTokens: 2, promptLogprobs: expect.any(Array) });
    expect(prefill.tokenIds).toHaveLength(2);
  });

  it('a decode check (as older manifests recorded) still works and still catches both faults', async () => {
    const client = await engine({ env: { VSNAP_REF_ATTENTION: 'FLASHINFER' } });
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'dec', client, { ...quiet, check: { mode: 'decode', maxTokens: 4 } });
    const recorded = snap.manifest.data.expectedResponse!;
    expect(recorded.tokenIds).toHaveLength(4);
    expect('promptLogprobs' in recorded).toBe(false);
    await suspendEngine(store, 'dec', client, quiet);
    const err = await restoreEngine(snap, client, quiet).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_RESPONSE_MISMATCH', details: { difference: expect.stringMatching(/^token 0 differs/) } });

    const plain = await engine();
    const snap2 = await captureEngine(store, 'dec2', plain, { check: { mode: 'decode', maxTokens: 2 } });
    await suspendEngine(store, 'dec2', plain);
    const flip = async () => void (await plain.wire.collectiveRpc('flip_weights_byte', { args: ['model.layers.0.mlp.weight', 77] }));
    await expect(restoreEngineWith(snap2, plain, {}, { beforeCheck: flip })).rejects.toMatchObject({ code: 'E_RESPONSE_MISMATCH' });
    await restoreEngine(snap2, plain);
  });
});
