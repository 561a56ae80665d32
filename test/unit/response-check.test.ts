import { describe, expect, it } from 'vitest';

import { checkOf, checkSpec, compareResponses } from '../../src/snapshot/engine-checks.js';
import type { ExpectedResponse } from '../../src/manifest/types.js';

const decode: ExpectedResponse = { prompt: 'p', maxTokens: 2, tokenIds: [5, 6], text: ' t5 t6', logprobs: [-0.5, -1.5] };
const prefill: ExpectedResponse = { ...decode, maxTokens: 2, promptTokenIds: [1, 2, 3], promptLogprobs: [-2.25, -3.5] };

describe('the expected-response check', () => {
  it('defaults to the cheapest check: the prompt scored and one token (one forward pass)', () => {
    expect(checkSpec({})).toEqual({ prompt: 'The capital of France is', mode: 'prefill', maxTokens: 1 });
    expect(checkSpec({ check: { mode: 'decode' } })).toEqual({ prompt: 'The capital of France is', mode: 'decode', maxTokens: 16 });
    // the older options still work; check wins over them
    expect(checkSpec({ probePrompt: 'a', probeMaxTokens: 4 })).toEqual({ prompt: 'a', mode: 'prefill', maxTokens: 4 });
    expect(checkSpec({ probePrompt: 'a', probeMaxTokens: 4, check: { prompt: 'b', maxTokens: 2 } })).toEqual({ prompt: 'b', mode: 'prefill', maxTokens: 2 });
    expect(() => checkSpec({ check: { maxTokens: 0 } })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
    expect(() => checkSpec({ check: { mode: 'greedy' as 'decode' } })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
  });

  it('re-runs the check a response was recorded with: older manifests (no prompt logprobs) keep the decode check', () => {
    expect(checkOf(decode)).toEqual({ prompt: 'p', maxTokens: 2, mode: 'decode' });
    expect(checkOf(prefill)).toEqual({ prompt: 'p', maxTokens: 2, mode: 'prefill' });
  });

  it('compares the prompt token ids and logprobs bit for bit (the tolerance applies), then the generated tokens', () => {
    expect(compareResponses(prefill, { ...prefill }, 0)).toBeUndefined();
    expect(compareResponses(prefill, { ...prefill, promptTokenIds: [1, 9, 3] }, 0)).toBe('prompt token 1 differs: expected 2, got 9');
    const nudged = { ...prefill, promptLogprobs: [-2.25, -3.5 + 2 ** -20] };
    expect(compareResponses(prefill, nudged, 0)).toMatch(/^prompt logprobs differ by up to 9\.5\d*e-7 \(tolerance 0\)$/);
    expect(compareResponses(prefill, nudged, 1e-6)).toBeUndefined();
    // an answer without prompt logprobs (or fewer of them) never passes a prefill check
    expect(compareResponses(prefill, decode, 0)).toMatch(/^prompt logprobs differ by up to NaN/);
    expect(compareResponses(prefill, { ...prefill, promptLogprobs: [-2.25] }, 0)).toMatch(/^prompt logprobs differ/);
    expect(compareResponses(prefill, { ...prefill, tokenIds: [5, 7] }, 0)).toBe('token 1 differs: expected 6, got 7');
    expect(compareResponses(prefill, { ...prefill, logprobs: [-0.5, -1.25] }, 0)).toBe('logprobs differ by up to 0.25 (tolerance 0)');
    // a decode check ignores prompt logprobs it did not record
    expect(compareResponses(decode, prefill, 0)).toBeUndefined();
  });
});
