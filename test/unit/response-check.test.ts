import { createServer } from 'node:http';

import { describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { checkOf, checkSpec, compareResponses, probe, recheck } from '../../src/engine/response-check.js';
import type { ExpectedResponse } from '../../src/manifest/types.js';

const decode: ExpectedResponse = { prompt: 'p', maxTokens: 2, tokenIds: [5, 6], text: ' t5 t6', logprobs: [-0.5, -1.5] };
const prefill: ExpectedResponse = { ...decode, maxTokens: 2, promptTokenIds: [1, 2, 3], promptLogprobs: [-2.25, -3.5] };

describe('the expected-response check', () => {
  it('defaults to the cheapest check: the prompt scored and one token (one forward pass)', () => {
    expect(checkSpec({})).toEqual({ prompt: 'The capital of France is', mode: 'prefill', maxTokens: 1 });
    expect(checkSpec({ mode: 'decode' })).toEqual({ prompt: 'The capital of France is', mode: 'decode', maxTokens: 16 });
    expect(checkSpec({ prompt: 'b', maxTokens: 2 })).toEqual({ prompt: 'b', mode: 'prefill', maxTokens: 2 });
    expect(() => checkSpec({ maxTokens: 0 })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
    expect(() => checkSpec({ mode: 'greedy' as 'decode' })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
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

describe('probe against an engine that ignores echo', () => {
  it('refuses with E_ENGINE_PROTOCOL and says to use the decode check', async () => {
    // an OpenAI-style server that answers the generated token only, whatever echo says
    const server = createServer((_req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({
        id: 'cmpl-1', object: 'text_completion', model: 'm',
        choices: [{ index: 0, text: ' x', finish_reason: 'length', logprobs: { tokens: ['token_id:9'], token_logprobs: [-0.5] } }],
        usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 },
      }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = new EngineClient({ baseUrl: `http://127.0.0.1:${(server.address() as { port: number }).port}` });
    try {
      await expect(probe(client, checkSpec({}))).rejects.toMatchObject({ code: 'E_ENGINE_PROTOCOL', message: expect.stringMatching(/mode: 'decode'/) });
      // the decode check works with it
      expect(await probe(client, checkSpec({ mode: 'decode', maxTokens: 1 }))).toEqual({ prompt: 'The capital of France is', maxTokens: 1, tokenIds: [9], text: ' x', logprobs: [-0.5] });
    } finally {
      await client.close();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

describe('recheck after a restore against an answer that cannot be used', () => {
  it("vLLM's web stack refusing to render NaN log-probabilities (400 BadRequestError) is E_RESPONSE_MISMATCH too", async () => {
    // Starlette's JSONResponse.render: json.dumps(allow_nan=False) raises ValueError on NaN, which
    // vLLM's exception handlers answer 400; the body as the reference engine gave it on an H200
    let body = '{"error":{"message":"Out of range float values are not JSON compliant: nan","type":"BadRequestError","param":null,"code":400}}';
    const server = createServer((_req, res) => {
      res.statusCode = 400;
      res.setHeader('content-type', 'application/json');
      res.end(body);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = new EngineClient({ baseUrl: `http://127.0.0.1:${(server.address() as { port: number }).port}` });
    const expected = { prompt: 'The capital of France is', maxTokens: 1, tokenIds: [3], text: ' t0', logprobs: [-0.5], promptTokenIds: [1, 2], promptLogprobs: [-1.25] };
    try {
      await expect(recheck(client, expected)).rejects.toMatchObject({ code: 'E_RESPONSE_MISMATCH', details: { unusable: true, status: 400 } });
      // any other 400 stays the engine's error
      body = '{"error":{"message":"This model\'s maximum context length is 8 tokens","type":"BadRequestError","param":null,"code":400}}';
      await expect(recheck(client, expected)).rejects.toMatchObject({ code: 'E_ENGINE_HTTP', details: { status: 400 } });
    } finally {
      await client.close();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('a body with NaN log-probabilities (not JSON) is E_RESPONSE_MISMATCH, not a protocol error', async () => {
    // Python's json.dumps writes NaN for the logprobs of broken weights (seen on an H200 with one
    // flipped exponent byte); the engine answered the same check at capture
    const server = createServer((_req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(
        '{"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [{"index": 0, "text": "The capital of France is t0", "finish_reason": "length", ' +
          '"logprobs": {"tokens": ["token_id:1", "token_id:2", "token_id:3"], "token_logprobs": [null, NaN, NaN]}}], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}',
      );
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = new EngineClient({ baseUrl: `http://127.0.0.1:${(server.address() as { port: number }).port}` });
    const expected = { prompt: 'The capital of France is', maxTokens: 1, tokenIds: [3], text: ' t0', logprobs: [-0.5], promptTokenIds: [1, 2], promptLogprobs: [-1.25] };
    try {
      await expect(probe(client, checkSpec({}))).rejects.toMatchObject({ code: 'E_ENGINE_PROTOCOL' }); // at capture: the engine's problem
      await expect(recheck(client, expected)).rejects.toMatchObject({ code: 'E_RESPONSE_MISMATCH', details: { unusable: true } }); // after a restore: the restore's
    } finally {
      await client.close();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
