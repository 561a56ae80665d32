import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { expect, it } from 'vitest';

import { startEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

const example = fileURLToPath(new URL('../../examples/capture-restore.mjs', import.meta.url));

it('examples/capture-restore.mjs runs against the built package', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [example, tempDir()]);
  expect(stdout).toMatch(/captured example .*: 2 regions, 100663296 bytes/);
  expect(stdout).toMatch(/restore 1: 100663296 bytes from the store tier/);
  expect(stdout).toMatch(/restore 2: 100663296 bytes from the ram tier/);
  expect(stdout).toMatch(/model\.embed_tokens\.weight: "contents of model\.embed_tokens\.weight"/);
});

it('examples/engine-suspend-restore.mjs runs against the reference engine', async () => {
  const engine = await startEngine();
  try {
    const script = fileURLToPath(new URL('../../examples/engine-suspend-restore.mjs', import.meta.url));
    const { stdout } = await promisify(execFile)(process.execPath, [script, tempDir()], {
      env: { ...process.env, VSNAP_ENGINE_URL: engine.url, VSNAP_TOKEN: engine.token },
    });
    expect(stdout).toMatch(/suspended \(captured first\)/);
    expect(stdout).toMatch(/restored \d+ bytes in [\d.]+ ms: wakeWeights/);
    expect(stdout).toMatch(/the engine answers again/);
  } finally {
    await engine.stop();
  }
});
