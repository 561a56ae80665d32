import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { describe, expect, it } from 'vitest';

import { tempDir } from '../helpers/tmp.js';

const run = promisify(execFile);
const canBuildPython = await run('python3', ['-c', 'import build, wheel, setuptools'])
  .then(() => true)
  .catch(() => run('/usr/bin/python3', ['-c', 'import build, wheel, setuptools']).then(() => true, () => false));

describe('what is published', () => {
  it('npm pack ships what users need (the build, the prebuild, the plugin, the schema, LICENSE) and no tests or sources', async () => {
    // the built package (npm test builds first); --ignore-scripts: no second build
    const { stdout } = await run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { maxBuffer: 64 * 1024 * 1024 });
    const files = (JSON.parse(stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path);
    for (const needed of [
      'package.json', 'README.md', 'LICENSE', 'CHANGELOG.md', 'binding.gyp',
      'dist/index.js', 'dist/index.cjs', 'dist/index.d.ts', 'dist/index.d.cts', 'dist/cli/main.js',
      'schema/serve-config.schema.json',
      'engines/vllm/pyproject.toml', 'engines/vllm/README.md', 'engines/vllm/vsnap_vllm/__init__.py',
    ]) expect(files, needed).toContain(needed);
    expect(files.some((f) => /^prebuilds\/linux-x64\/.*\.node$/.test(f))).toBe(true);
    expect(files.some((f) => f.startsWith('native/'))).toBe(true); // sources for a build from source
    const unwanted = files.filter((f) => /^(test|src|bench|examples|docs|scripts|\.ci)\/|^dist\/api-|__pycache__|\.egg-info|^engines\/vllm\/tests\//.test(f));
    expect(unwanted).toEqual([]);
    // the status page is inside the bundle, not a file that could be left out
    expect(readFileSync('dist/cli/main.js', 'utf8')).toContain('<title>vsnap serve</title>');
    const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as Record<string, unknown>;
    for (const key of ['repository', 'bugs', 'homepage', 'license']) expect(pkg[key], key).toBeDefined();
  });

  it.skipIf(!canBuildPython && process.env.CI !== 'true')('the vLLM plugin builds an sdist and a wheel whose version is the SDK\'s, leaving nothing in the checkout', async () => {
    const out = tempDir();
    const before = readdirSync('engines/vllm').sort();
    await run(process.execPath, ['scripts/build-python.mjs', out]);
    const version = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;
    expect(readdirSync(out).sort()).toEqual([`vsnap-vllm-${version}.tar.gz`, `vsnap_vllm-${version}-py3-none-any.whl`]);
    expect(readdirSync('engines/vllm').sort()).toEqual(before);
  });
});
