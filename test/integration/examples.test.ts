import { execFile, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { request } from 'undici';
import { expect, it } from 'vitest';

import { startEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';
import { freePort } from '../helpers/net.js';

const example = (name: string): string => fileURLToPath(new URL(`../../examples/${name}`, import.meta.url));
/** Runs TypeScript examples the way users script them: with tsx (`node --import tsx`)... */
const tsx = (file: string, args: string[] = []): string[] => ['--import', 'tsx', file, ...args];
/** ...or with ts-node (`node --loader ts-node/esm`). */
const tsNode = (file: string, args: string[] = []): string[] => ['--no-warnings', '--loader', 'ts-node/esm', file, ...args];

it('examples/capture-restore.mjs runs against the built package', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [example('capture-restore.mjs'), tempDir()]);
  expect(stdout).toMatch(/captured example .*: 2 regions, 100663296 bytes/);
  expect(stdout).toMatch(/restore 1: 100663296 bytes from the store tier/);
  expect(stdout).toMatch(/restore 2: 100663296 bytes from the ram tier/);
  expect(stdout).toMatch(/model\.embed_tokens\.weight: "contents of model\.embed_tokens\.weight"/);
});

it('examples/suspend-restore.ts runs with ts-node against the reference engine', async () => {
  const engine = await startEngine();
  try {
    const { stdout } = await promisify(execFile)(process.execPath, tsNode(example('suspend-restore.ts'), [tempDir()]), {
      env: { ...process.env, VSNAP_ENGINE_URL: engine.url, VSNAP_TOKEN: engine.token, TS_NODE_TRANSPILE_ONLY: '1' },
    });
    expect(stdout).toMatch(/suspended \(captured first\)/);
    expect(stdout).toMatch(/restored \d+ bytes in [\d.]+ ms: prepare [\d.]+ ms, allocate [\d.]+ ms, hydrate/);
    expect(stdout).toMatch(/the engine answers again/);
  } finally {
    await engine.stop();
  }
});

it('examples/router.ts (with tsx) routes two models through one budget', async () => {
  const a = await startEngine({ seed: 1, model: 'llama' });
  const b = await startEngine({ seed: 2, model: 'qwen' });
  const port = await freePort();
  const router = spawn(process.execPath, tsx(example('router.ts'), [`${a.url}=llama`, `${b.url}=qwen`]), {
    env: { ...process.env, VSNAP_TOKEN: a.token, PORT: String(port), VSNAP_STORE: tempDir() },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  router.stdout.on('data', (d: Buffer) => (out += d.toString()));
  router.stderr.on('data', (d: Buffer) => (out += d.toString()));
  try {
    await new Promise<void>((resolve, reject) => {
      const t = setInterval(() => {
        if (out.includes('routing')) {
          clearInterval(t);
          resolve();
        }
        if (router.exitCode !== null) {
          clearInterval(t);
          reject(new Error(out));
        }
      }, 50);
    });
    for (const model of ['qwen', 'llama', 'qwen']) {
      const r = await request(`http://127.0.0.1:${port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, prompt: 'Hello', max_tokens: 4 }),
      });
      expect(r.statusCode).toBe(200);
      expect(((await r.body.json()) as { model: string }).model).toBe(model);
    }
    expect(out).toMatch(/restore (qwen|llama): \d+ ms/);
  } finally {
    router.kill('SIGTERM');
    await new Promise((r) => router.on('exit', r));
    await a.stop();
    await b.stop();
  }
});
