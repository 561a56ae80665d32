#!/usr/bin/env node
// Starts the reference engine (a small stand-in for vLLM with the vsnap plugin, in host memory: no
// GPU needed) from vsnap's package root: a checkout, or an installed package, which ships
// test/fixtures/engine for this. `vsnap serve --config examples/quickstart/serve.yaml`, run in
// the package root (`npm run quickstart`), runs two of these. Usage: node examples/quickstart/reference-engine.mjs --port N [--seed S] [--model NAME]
// Its options are those of test/fixtures/engine/serve.py.
import { execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { tmpdir, userInfo } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const engineDir = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', 'test', 'fixtures', 'engine');
// The plugin made importable and discoverable (entry point included), as `pip install ./engines/vllm`
// would: one directory per user and checkout, made again (the same files) at each start, so none piles up.
const checkout = createHash('sha256').update(engineDir).digest('hex').slice(0, 12);
const site = join(tmpdir(), `vsnap-reference-site-${userInfo().uid}-${checkout}`);
execFileSync('python3', [join(engineDir, 'plugin_site.py'), site], { stdio: ['ignore', 'ignore', 'inherit'] });
const child = spawn('python3', [join(engineDir, 'serve.py'), '--device', 'host', '--enable-sleep-mode', ...process.argv.slice(2)], {
  stdio: 'inherit',
  env: { ...process.env, PYTHONPATH: site, VLLM_PLUGINS: 'vsnap', VLLM_SERVER_DEV_MODE: '1' },
});
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => child.kill(signal));
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
