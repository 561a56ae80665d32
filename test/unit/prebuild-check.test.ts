import { execFileSync, spawnSync } from 'node:child_process';
import { appendFileSync, cpSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { expect, it } from 'vitest';

import { packageRoot } from '../../src/native/index.js';
import { tempDir } from '../helpers/tmp.js';

function copyOfRepo(): string {
  const root = packageRoot();
  const copy = tempDir();
  for (const part of ['binding.gyp', 'native', 'prebuilds', '.ci']) cpSync(join(root, part), join(copy, part), { recursive: true });
  return copy;
}

it('CI fails when native/ changed but the prebuilds were not rebuilt', () => {
  const copy = copyOfRepo();
  const script = join(copy, '.ci', 'check-prebuild.mjs');
  expect(execFileSync(process.execPath, [script], { encoding: 'utf8' })).toMatch(/in step with native/);
  appendFileSync(join(copy, 'native', 'addon.cc'), '\n// a change\n');
  const stale = spawnSync(process.execPath, [script], { encoding: 'utf8' });
  expect(stale.status).toBe(1);
  expect(stale.stderr).toMatch(/changed since the committed prebuilds were built/);
  expect(stale.stderr).toMatch(/npm run build:native/);
});

it.each(['x64', 'arm64'])('CI fails when the %s prebuild needs a glibc newer than 2.35', (arch) => {
  const copy = copyOfRepo();
  const dir = join(copy, 'prebuilds', `linux-${arch}`);
  const file = join(dir, readdirSync(dir).find((f) => f.endsWith('.node'))!);
  const bytes = readFileSync(file);
  // Rename the version the binary asks of libc.so.6 (same length): GLIBC_2.17 / GLIBC_2.2.5 -> GLIBC_2.99.
  const from = Buffer.from(arch === 'x64' ? 'GLIBC_2.2.5\0' : 'GLIBC_2.17\0');
  const at = bytes.indexOf(from);
  expect(at).toBeGreaterThan(0);
  Buffer.from(arch === 'x64' ? 'GLIBC_2.995\0' : 'GLIBC_2.99\0').copy(bytes, at);
  writeFileSync(file, bytes);
  const run = spawnSync(process.execPath, [join(copy, '.ci', 'check-prebuild.mjs')], { encoding: 'utf8' });
  expect(run.status).toBe(1);
  expect(run.stderr).toMatch(new RegExp(`linux-${arch}/.*needs GLIBC_2\\.99\\d*, newer than GLIBC_2\\.35`));
});

it('the committed prebuilds need no more than Ubuntu 22.04 has, as REQUIREMENTS.json records', () => {
  const req = JSON.parse(readFileSync(join(packageRoot(), 'prebuilds', 'REQUIREMENTS.json'), 'utf8')) as Record<string, { glibc: string; glibcxx: string }>;
  expect(Object.keys(req).sort()).toEqual(['linux-arm64', 'linux-x64']);
  for (const r of Object.values(req)) {
    expect(Number(r.glibc.split('.')[1])).toBeLessThanOrEqual(35);
    expect(r.glibcxx.localeCompare('3.4.29', undefined, { numeric: true })).toBeLessThanOrEqual(0);
  }
});
