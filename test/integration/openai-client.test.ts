import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import OpenAI, { NotFoundError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { parseConfig } from '../../src/serve/config.js';
import { serve, type ServeHandle } from '../../src/serve/serve.js';
import { freePort } from '../helpers/net.js';

// vsnap serve's OpenAI routes, spoken to by the official `openai` npm client (a client no one here
// wrote): two reference engines on the CPU, a budget for one awake, an API key on /v1.
const API_KEY = 'sk-vsnap-test';
let handle: ServeHandle;
let client: OpenAI;
let dir: string; // for the whole file (tempDir() is removed after each test)

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vsnap-openai-'));
  const engine = (port: number, seed: number, model: string) => `
    command: node
    args: [examples/quickstart/reference-engine.mjs, --port, "\${PORT}", --seed, "${seed}", --model, ${model}]
    port: ${port}
    token: engine-token-${seed}
    memoryGiB: 0.6`;
  const config = parseConfig(
    `listen: { port: 0 }\nstore: ${join(dir, 'store')}\napiKey: ${API_KEY}\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n` +
      `  org/model-a:${engine(await freePort(), 1, 'org/model-a')}\n  model-b:${engine(await freePort(), 2, 'model-b')}\n`,
    'openai-client.yaml',
  );
  handle = await serve(config, { log: () => undefined, stateDir: join(dir, 'state') });
  await handle.booted;
  client = new OpenAI({ baseURL: `${handle.agent.url}/v1`, apiKey: API_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await handle?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('the official openai client against vsnap serve', () => {
  it('models.list and models.retrieve (an id with a slash too); an unknown id is a NotFoundError with OpenAI\'s error body', async () => {
    const listed = [];
    for await (const m of client.models.list()) listed.push(m);
    expect(listed.map((m) => m.id).sort()).toEqual(['model-b', 'org/model-a']);
    for (const m of listed) expect(m).toMatchObject({ object: 'model', owned_by: 'vsnap', created: expect.any(Number) as number });

    expect(await client.models.retrieve('org/model-a')).toEqual(listed.find((m) => m.id === 'org/model-a'));
    expect(await client.models.retrieve('model-b')).toMatchObject({ id: 'model-b', object: 'model' });

    const missing = await client.models.retrieve('no-such-model').catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(NotFoundError);
    expect(missing).toMatchObject({ status: 404, code: 'model_not_found', param: 'model', type: 'invalid_request_error' });
    expect((missing as Error).message).toMatch(/The model 'no-such-model' does not exist/);
  });

  it('completions.create, plain and streamed: every chunk carries id, object, created and model', async () => {
    const plain = await client.completions.create({ model: 'model-b', prompt: 'The capital of France is', max_tokens: 4 });
    expect(plain).toMatchObject({ object: 'text_completion', model: 'model-b', id: expect.stringMatching(/^cmpl-/) as string, created: expect.any(Number) as number });
    expect(plain.choices[0]!.text).toMatch(/^( t\d+){4}$/);
    expect(plain.usage?.completion_tokens).toBe(4);

    const stream = await client.completions.create({ model: 'org/model-a', prompt: 'The capital of France is', max_tokens: 4, stream: true });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks).toHaveLength(4);
    for (const c of chunks) {
      expect(c).toMatchObject({ id: expect.stringMatching(/^cmpl-/) as string, object: 'text_completion', model: 'org/model-a', created: expect.any(Number) as number });
    }
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1); // one completion
    expect(chunks.map((c) => c.choices[0]!.text).join('')).toMatch(/^( t\d+){4}$/);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('length');
  });

  it('chat.completions.create, plain and streamed: every chunk carries id, object, created and model', async () => {
    const messages = [{ role: 'user' as const, content: 'Hello' }];
    const plain = await client.chat.completions.create({ model: 'model-b', messages, max_tokens: 3 });
    expect(plain).toMatchObject({ object: 'chat.completion', model: 'model-b', id: expect.stringMatching(/^chatcmpl-/) as string, created: expect.any(Number) as number });
    expect(plain.choices[0]!.message).toMatchObject({ role: 'assistant', content: expect.stringMatching(/^( t\d+){3}$/) as string });

    const stream = await client.chat.completions.create({ model: 'org/model-a', messages, max_tokens: 3, stream: true });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.length).toBeGreaterThanOrEqual(3);
    for (const c of chunks) {
      expect(c).toMatchObject({ id: expect.stringMatching(/^chatcmpl-/) as string, object: 'chat.completion.chunk', model: 'org/model-a', created: expect.any(Number) as number });
    }
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    expect(chunks.map((c) => c.choices[0]!.delta.content ?? '').join('')).toMatch(/^( t\d+){3}$/);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('length');

    // the chat stream's helper assembles the same answer
    const runner = client.chat.completions.stream({ model: 'model-b', messages, max_tokens: 3 });
    const final = await runner.finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe(plain.choices[0]!.message.content);
  });

  it("an unknown model is the same NotFoundError (model_not_found) on completions and chat; stream_options.include_usage ends a stream with the usage", async () => {
    for (const call of [
      () => client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }),
      () => client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }], max_tokens: 1 }),
    ]) {
      const missing = await call().catch((e: unknown) => e);
      expect(missing).toBeInstanceOf(NotFoundError);
      expect(missing).toMatchObject({ status: 404, code: 'model_not_found', param: 'model', type: 'invalid_request_error' });
    }
    const stream = await client.completions.create({ model: 'model-b', prompt: 'The capital of France is', max_tokens: 4, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks).toHaveLength(5);
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage).toMatchObject({ completion_tokens: 4 });
    const chat = await client.chat.completions.create({ model: 'model-b', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 3, stream: true, stream_options: { include_usage: true } });
    const chatChunks = [];
    for await (const chunk of chat) chatChunks.push(chunk);
    expect(chatChunks.at(-1)!.choices).toEqual([]);
    expect(chatChunks.at(-1)!.usage).toMatchObject({ completion_tokens: 3 });
  });

  it('a wrong API key is an AuthenticationError', async () => {
    const wrong = new OpenAI({ baseURL: `${handle.agent.url}/v1`, apiKey: 'sk-wrong', maxRetries: 0 });
    await expect(wrong.models.list()).rejects.toMatchObject({ status: 401 });
  });
});
