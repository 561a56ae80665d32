import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { expect, it } from 'vitest';

import { tempDir } from '../helpers/tmp.js';

const example = fileURLToPath(new URL('../../examples/capture-restore.mjs', import.meta.url));

it('examples/capture-restore.mjs runs against the built package', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [example, tempDir()]);
  expect(stdout).toMatch(/captured example .*: 2 regions, 100663296 bytes/);
  expect(stdout).toMatch(/restore 1: 100663296 bytes from the store tier/);
  expect(stdout).toMatch(/restore 2: 100663296 bytes from the ram tier/);
  expect(stdout).toMatch(/model\.embed_tokens\.weight: "contents of model\.embed_tokens\.weight"/);
});
