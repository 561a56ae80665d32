#!/usr/bin/env node
// Builds the vLLM plugin's sdist and wheel (engines/vllm, Python package vsnap-vllm) into
// dist-python/ (or the directory given), from a temporary copy so that no build leftovers
// (*.egg-info, build/) land in the checkout. Its version must be the SDK's (package.json): the
// two are released together. Needs a python3 with the `build` module (Debian: python3-build
// python3-wheel); it runs offline (--no-isolation).
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const out = resolve(process.argv[2] ?? join(root, 'dist-python'));
const sdkVersion = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version;
const pyVersion = /^version = "([^"]+)"/m.exec(readFileSync(join(root, 'engines/vllm/pyproject.toml'), 'utf8'))?.[1];
if (pyVersion !== sdkVersion) {
  console.error(`engines/vllm/pyproject.toml has version ${pyVersion}, package.json ${sdkVersion}: make them the same`);
  process.exit(1);
}
const python = ['python3', '/usr/bin/python3'].find((p) => {
  try {
    execFileSync(p, ['-c', 'import build, wheel, setuptools'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
});
if (!python) {
  console.error('no python3 with the build, wheel and setuptools modules (Debian: apt-get install python3-build python3-wheel)');
  process.exit(1);
}
const work = mkdtempSync(join(tmpdir(), 'vsnap-python-build-'));
try {
  cpSync(join(root, 'engines/vllm'), join(work, 'vllm'), { recursive: true, filter: (src) => !/__pycache__|\.egg-info|[/\\]build$|[/\\]tests$/.test(src) });
  mkdirSync(out, { recursive: true });
  execFileSync(python, ['-m', 'build', '--no-isolation', '--sdist', '--wheel', '--outdir', out, join(work, 'vllm')], { stdio: ['ignore', 'ignore', 'inherit'] });
  console.log(readdirSync(out).filter((f) => f.includes(sdkVersion)).join('\n'));
} finally {
  rmSync(work, { recursive: true, force: true });
}
