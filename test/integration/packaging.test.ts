import { execFile, execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';

import { freePort } from '../helpers/net.js';
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
      // the quick start without a GPU, and the reference engine it runs
      'examples/quickstart/serve.yaml', 'examples/quickstart/reference-engine.mjs',
      'test/fixtures/engine/serve.py', 'test/fixtures/engine/host_model.py', 'test/fixtures/engine/plugin_site.py',
      'test/fixtures/engine/vllm/entrypoints/serve/routers.py',
    ]) expect(files, needed).toContain(needed);
    expect(files.some((f) => /^prebuilds\/linux-x64\/.*\.node$/.test(f))).toBe(true);
    expect(files.some((f) => f.startsWith('native/'))).toBe(true); // sources for a build from source
    const shipped = /^(examples\/quickstart|test\/fixtures\/engine)\//;
    const unwanted = files.filter((f) => !shipped.test(f) && /^(test|src|bench|examples|docs|scripts|\.ci)\/|^dist\/api-|__pycache__|\.egg-info|^engines\/vllm\/tests\//.test(f));
    expect(unwanted).toEqual([]);
    // source maps ship as mappings only: src/ is not published, and the sources inside them were 39% of the package
    const maps = files.filter((f) => f.endsWith('.map'));
    expect(maps.length).toBeGreaterThan(0);
    for (const m of maps) expect((JSON.parse(readFileSync(m, 'utf8')) as { sourcesContent?: unknown }).sourcesContent, m).toBeUndefined();
    expect(files).not.toContain('dist/.build-inputs');
    // the status page is inside the bundle, not a file that could be left out
    expect(readFileSync('dist/cli/main.js', 'utf8')).toContain('<title>vsnap serve</title>');
    const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as Record<string, unknown>;
    for (const key of ['repository', 'bugs', 'homepage', 'license']) expect(pkg[key], key).toBeDefined();
  });

  it('the quick start runs from the packed package: two reference engines, completions and chat (streamed too)', async () => {
    const dir = tempDir();
    const { stdout } = await run('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', dir], { maxBuffer: 64 * 1024 * 1024 });
    await run('tar', ['xzf', join(dir, (JSON.parse(stdout) as Array<{ filename: string }>)[0]!.filename), '-C', dir]);
    const pkg = join(dir, 'package');
    symlinkSync(join(process.cwd(), 'node_modules'), join(pkg, 'node_modules')); // its dependencies, as npm install would place them
    const config = parse(readFileSync(join(pkg, 'examples/quickstart/serve.yaml'), 'utf8')) as { listen: { port: number }; store: string; models: Record<string, { port: number }> };
    config.store = join(dir, 'store');
    config.listen.port = await freePort();
    for (const m of Object.values(config.models)) m.port = await freePort();
    writeFileSync(join(dir, 'serve.yaml'), stringify(config));
    // as the README says for an installed package: `npm run quickstart` in its directory
    const serve = spawn(process.execPath, ['dist/cli/main.js', 'serve', '--config', join(dir, 'serve.yaml')], { cwd: pkg, stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      let log = '';
      const url = await new Promise<string>((resolve, reject) => {
        serve.stderr.on('data', (d: Buffer) => {
          log += d.toString();
          const m = /serving .* on (http:\/\/\S+)/.exec(log);
          if (m) resolve(m[1]!);
        });
        serve.once('exit', (code) => reject(new Error(`vsnap serve exited (${code}):\n${log}`)));
      });
      const post = async (route: string, body: unknown) => {
        const r = await request(`${url}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
        return { status: r.statusCode, text: await r.body.text() };
      };
      const messages = [{ role: 'user', content: 'The capital of France is' }];
      for (const model of ['reference-b', 'reference-a']) {
        const chat = await post('/v1/chat/completions', { model, messages, max_tokens: 4 });
        expect(chat.status, chat.text).toBe(200);
        const answer = JSON.parse(chat.text) as { object: string; model: string; choices: Array<{ message: { role: string; content: string } }> };
        expect(answer).toMatchObject({ object: 'chat.completion', model, choices: [{ message: { role: 'assistant' } }] });
        // the chat template is fixed: the same answer as the completion of the templated prompt
        const plain = JSON.parse((await post('/v1/completions', { model, prompt: 'user: The capital of France is\nassistant:', max_tokens: 4 })).text) as { choices: Array<{ text: string }> };
        expect(answer.choices[0]!.message.content).toBe(plain.choices[0]!.text);
        const streamed = await post('/v1/chat/completions', { model, messages, max_tokens: 4, stream: true });
        const chunks = streamed.text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
        expect(chunks.at(-1)).toBe('[DONE]');
        const deltas = chunks.slice(0, -1).map((c) => JSON.parse(c) as { object: string; choices: Array<{ delta: { role?: string; content?: string }; finish_reason: string | null }> });
        expect(deltas.every((d) => d.object === 'chat.completion.chunk')).toBe(true);
        expect(deltas[0]!.choices[0]!.delta.role).toBe('assistant');
        expect(deltas.at(-1)!.choices[0]!.finish_reason).toBe('length');
        expect(deltas.map((d) => d.choices[0]!.delta.content ?? '').join('')).toBe(answer.choices[0]!.message.content);
      }
      const bad = await post('/v1/chat/completions', { model: 'reference-a', messages: [] });
      expect(bad.status).toBe(400);
    } finally {
      const exited = new Promise((r) => serve.once('exit', r));
      serve.kill('SIGTERM');
      await exited;
    }
  });

  it.skipIf(!canBuildPython && process.env.CI !== 'true')('the vLLM plugin builds an sdist and a wheel whose version is the SDK\'s, leaving nothing in the checkout', async () => {
    const out = tempDir();
    const before = readdirSync('engines/vllm').sort();
    await run(process.execPath, ['scripts/build-python.mjs', out]);
    const version = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;
    expect(readdirSync(out).sort()).toEqual([`vsnap-vllm-${version}.tar.gz`, `vsnap_vllm-${version}-py3-none-any.whl`]);
    expect(readdirSync('engines/vllm').sort()).toEqual(before);
    // Both carry the digest kernel the workers run over their weights (vsnap_vllm/gd1.py).
    const list = (script: string, file: string): string => execFileSync('python3', ['-c', script, join(out, file)], { encoding: 'utf8' });
    expect(list('import sys, zipfile; print("\\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))', `vsnap_vllm-${version}-py3-none-any.whl`)).toContain('vsnap_vllm/digest_kernel.fatbin');
    expect(list('import sys, tarfile; print("\\n".join(tarfile.open(sys.argv[1]).getnames()))', `vsnap-vllm-${version}.tar.gz`)).toContain('vsnap_vllm/digest_kernel.fatbin');
  });
});
