import { execFileSync, spawnSync } from 'node:child_process';
import { appendFileSync, cpSync } from 'node:fs';
import { join } from 'node:path';

import { expect, it } from 'vitest';

import { packageRoot } from '../../src/native/index.js';
import { tempDir } from '../helpers/tmp.js';

it('CI fails when native/ changed but the prebuild was not rebuilt', () => {
  const root = packageRoot();
  const copy = tempDir();
  for (const part of ['binding.gyp', 'native', 'prebuilds', '.ci']) cpSync(join(root, part), join(copy, part), { recursive: true });
  const script = join(copy, '.ci', 'check-prebuild.mjs');
  expect(execFileSync(process.execPath, [script], { encoding: 'utf8' })).toMatch(/in step with native/);
  appendFileSync(join(copy, 'native', 'addon.cc'), '\n// a change\n');
  const stale = spawnSync(process.execPath, [script], { encoding: 'utf8' });
  expect(stale.status).toBe(1);
  expect(stale.stderr).toMatch(/changed since the committed prebuild was built/);
  expect(stale.stderr).toMatch(/npm run build:native/);
});
