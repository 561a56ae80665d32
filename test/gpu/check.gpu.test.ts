// GPU suite, the expected-response check (device only): the reference engine's transformer on
// CUDA (~2.2 GiB). The default check (the prompt scored with its log-probabilities plus one
// generated token: one forward pass) against the 16-token decode check it replaces: what each
// costs after a restore (logged, the `expectedResponse` phase), and that it catches what the
// check exists for: the FlashInfer-like workspace (VSNAP_REF_ATTENTION=FLASHINFER) and one
// flipped weights byte, at least everything the decode check catches.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { captureEngine, cudaStatus, EngineClient, RegionStore, restoreEngine, suspendEngine, type Snapshot, type VsnapError } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { checkOf, compareResponses, recheck } from '../../src/engine/response-check.js';
import { restoreEngineWith } from '../../src/flows/restore.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';

const MODEL_ARGS = ['--layers', '18', '--hidden', '2048'];
const HIDDEN = 2048;
const INTER = 5632; // torch_model.load_torch_model: int(hidden * 2.75) // 256 * 256
const T = 'T'.charCodeAt(0); // a prompt token: its embedding row is read

/** Tensors every forward pass reads (q/k/v are read through their fused copy, so not those): name, elements, bytes per element. */
const TENSORS: Array<[string, number, number]> = [
  ['embed_tokens', 32000 * HIDDEN, 2],
  ['layers.0.o_proj', HIDDEN * HIDDEN, 2],
  ['layers.5.input_norm.weight', HIDDEN, 4],
  ['layers.9.gate_proj', INTER * HIDDEN, 2],
  ['layers.9.up_proj', INTER * HIDDEN, 2],
  ['layers.17.down_q', HIDDEN * INTER, 1],
  ['layers.17.down_scale', HIDDEN, 2],
  ['norm.weight', HIDDEN, 4],
  ['lm_head', 32000 * HIDDEN, 2],
];

/**
 * The byte offset of the most (`msb`) or least significant byte of one element of `name`. The
 * most significant byte of a float holds its sign and exponent: flipped, the value is off by
 * orders of magnitude, a fault every check must catch. An int8 element (scaled by a per-row
 * factor down to 1e-4 or less) or a float's low mantissa byte can change the answer by less
 * than bf16 rounding: no output check is sure to see those, so they are only compared.
 */
function offsetOf(name: string, elements: number, size: number, msb: boolean): number {
  const element = name === 'embed_tokens' ? T * HIDDEN + HIDDEN / 2 : Math.floor(elements / 2);
  return element * size + (msb ? size - 1 : 0);
}

const ms = (s: number | undefined) => `${((s ?? Number.NaN) * 1000).toFixed(1)} ms`;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

describe('GPU: the expected-response check', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  let a: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let dir: string;
  let prefill: Snapshot;
  let decode: Snapshot;
  const flip = (name: string, offset: number) => client.wire.collectiveRpc('flip_weights_byte', { args: [name, offset] });

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-check-'));
    store = await RegionStore.open(dir);
    a = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS });
    client = new EngineClient({ baseUrl: a.url, token: a.token });
    prefill = await captureEngine(store, 'prefill', client); // the default check
    decode = await captureEngine(store, 'decode', client, { check: { mode: 'decode', maxTokens: 16 } }); // the one before
  });

  after(async () => {
    await client?.close();
    await a?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it('records the prompt scored plus one token; after a restore it costs one forward pass (phase expectedResponse, against 16-token decode)', async () => {
    const recorded = prefill.manifest.data.expectedResponse!;
    assert.equal(recorded.maxTokens, 1);
    assert.deepEqual(recorded.promptTokenIds, [...Buffer.from('The capital of France is')]);
    assert.equal(recorded.promptLogprobs?.length, recorded.promptTokenIds!.length - 1);
    assert.equal(decode.manifest.data.expectedResponse!.promptLogprobs, undefined);
    const answer = await askCapital(client, 16);
    const costs: Record<string, number[]> = { prefill: [], decode: [] };
    for (let round = 0; round < 3; round++) {
      for (const [label, snap] of [['prefill', prefill], ['decode', decode]] as const) {
        await suspendEngine(store, snap.name, client);
        const report = await restoreEngine(snap, client);
        costs[label]!.push(report.phases.expectedResponse!);
        assert.deepEqual(await askCapital(client, 16), answer);
      }
    }
    console.log(`expectedResponse phase, median of 3 restores: prefill + 1 token ${ms(median(costs.prefill!))}, decode 16 tokens ${ms(median(costs.decode!))}`);
  });

  it('one flipped weights byte after the restore (the sign and exponent byte of an element of each float tensor the forward pass reads): E_RESPONSE_MISMATCH, engine asleep', async () => {
    for (const [name, elements, size] of TENSORS.filter(([, , size]) => size > 1)) {
      await suspendEngine(store, 'prefill', client);
      const offset = offsetOf(name, elements, size, true);
      await assert.rejects(restoreEngineWith(prefill, client, {}, { beforeCheck: async () => void (await flip(name, offset)) }), (err: VsnapError) => {
        assert.equal(err.code, 'E_RESPONSE_MISMATCH', `${name}[${offset}]: ${err.message}`);
        console.log(`flip ${name}[${offset}]: caught (${String(err.details.difference)})`);
        return true;
      });
      assert.equal((await client.wire.vsnapStatus()).sleeping, true);
    }
    await restoreEngine(prefill, client); // the snapshot puts every byte back
  });

  it('subtle flips too: the prefill check catches every flip the 16-token decode check catches', async () => {
    const expected = { prefill: prefill.manifest.data.expectedResponse!, decode: decode.manifest.data.expectedResponse! };
    assert.equal(checkOf(expected.prefill).mode, 'prefill');
    // differs: the answer compares unequal, or cannot be used at all (NaN log-probabilities:
    // recheck throws E_RESPONSE_MISMATCH itself)
    const differs = (e: typeof expected.prefill): Promise<boolean> =>
      recheck(client, e).then(
        (actual) => compareResponses(e, actual, 0) !== undefined,
        (err: VsnapError) => {
          if (err.code === 'E_RESPONSE_MISMATCH') return true;
          throw err;
        },
      );
    const caught = async () => ({ prefill: await differs(expected.prefill), decode: await differs(expected.decode) });
    assert.deepEqual(await caught(), { prefill: false, decode: false }, 'both checks pass on the restored weights');
    const rows: string[] = [];
    for (const [name, elements, size] of TENSORS) {
      for (const msb of size > 1 ? [true, false] : [true]) {
        const offset = offsetOf(name, elements, size, msb);
        await flip(name, offset);
        const got = await caught();
        await flip(name, offset); // the same XOR again: the byte back
        rows.push(`${name}[${offset}] ${msb ? 'msb' : 'lsb'}: prefill ${got.prefill ? 'caught' : 'missed'}, decode ${got.decode ? 'caught' : 'missed'}`);
        if (got.decode) assert.ok(got.prefill, `the decode check caught ${name}[${offset}] and the prefill check did not`);
        if (msb && size > 1) assert.ok(got.prefill, `the prefill check missed ${name}[${offset}] (a float's sign and exponent byte)`);
      }
    }
    console.log(rows.join('\n'));
    assert.deepEqual(await caught(), { prefill: false, decode: false }, 'every byte flipped back');
  });
});

describe('GPU: the expected-response check against the FlashInfer-like workspace', async () => {
  const status = await cudaStatus();
  if (!status.available) return;

  it('VSNAP_REF_ATTENTION=FLASHINFER: the prefill check (and the decode check) fail the restore; the engine is left asleep', async () => {
    const dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-check-fi-'));
    const e = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS, env: { VSNAP_REF_ATTENTION: 'FLASHINFER' } });
    const c = new EngineClient({ baseUrl: e.url, token: e.token });
    const quiet = { onWarning: () => undefined };
    try {
      const store = await RegionStore.open(dir);
      const snaps = [await captureEngine(store, 'fi-prefill', c, quiet), await captureEngine(store, 'fi-decode', c, { ...quiet, check: { mode: 'decode', maxTokens: 16 } })];
      await suspendEngine(store, 'fi-prefill', c, quiet);
      for (const snap of snaps) {
        // asleep: after the first failure the restore put it back to sleep
        await assert.rejects(restoreEngine(snap, c, quiet), (err: VsnapError) => {
          assert.equal(err.code, 'E_RESPONSE_MISMATCH', err.message);
          console.log(`FlashInfer-like workspace, ${snap.name}: caught (${String(err.details.difference)})`);
          return true;
        });
        assert.equal((await c.wire.vsnapStatus()).sleeping, true);
      }
    } finally {
      await c.close();
      await e.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
