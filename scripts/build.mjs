#!/usr/bin/env node
// `npm run build`: empties dist/, bundles it with tsup, and records in dist/.build-inputs the
// sha256 of everything the bundle is made from (src/, the tsup and TypeScript configs, the
// package and lock files). `--if-stale` (npm test) builds only when dist/ lacks that record or it
// differs from the inputs now, so `npm ci` (prepare) then `npm test` builds once, and a test run
// never uses a dist/ older than the code of the checkout.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = fileURLToPath(new URL('..', import.meta.url));
const RECORD = '.build-inputs'; // in dist/
const CONFIG = ['tsup.config.ts', 'tsconfig.json', 'package.json', 'package-lock.json'];
// what the bundle's entries are; a build without them is no build
const OUTPUTS = ['index.js', 'index.cjs', 'index.d.ts', 'index.d.cts', 'cli/main.js'];

function files(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]));
}

/** The sha256 of the build's inputs under `root`: every file's path and bytes, in a fixed order. @internal */
export function inputsDigest(root = repo) {
  const inputs = [...files(join(root, 'src')), ...CONFIG.map((f) => join(root, f)).filter((f) => existsSync(f))]
    .map((p) => relative(root, p).split('\\').join('/'))
    .sort();
  const hash = createHash('sha256');
  for (const rel of inputs) {
    hash.update(`${rel}\n`);
    hash.update(readFileSync(join(root, rel)));
    hash.update('\n');
  }
  return hash.digest('hex');
}

/** Why `root`'s dist/ must be rebuilt, or undefined when it was built from the inputs as they are now. @internal */
export function staleReason(root = repo, digest = inputsDigest(root)) {
  const record = join(root, 'dist', RECORD);
  const missing = OUTPUTS.filter((f) => !existsSync(join(root, 'dist', f)));
  if (missing.length) return `dist/ lacks ${missing.join(', ')}`;
  if (!existsSync(record)) return 'dist/ has no record of what it was built from';
  if (readFileSync(record, 'utf8').trim() !== digest) return 'src/ or the build configuration changed since dist/ was built';
  return undefined;
}

function build(root, digest) {
  rmSync(join(root, 'dist'), { recursive: true, force: true });
  const manifest = createRequire(import.meta.url).resolve('tsup/package.json');
  const bin = JSON.parse(readFileSync(manifest, 'utf8')).bin.tsup;
  const tsup = spawnSync(process.execPath, [join(dirname(manifest), bin)], { cwd: root, stdio: 'inherit' });
  if (tsup.status !== 0) process.exit(tsup.status ?? 1);
  // the digest of the inputs as they were when the build began: a file changed during it leaves dist/ stale
  writeFileSync(join(root, 'dist', RECORD), `${digest}\n`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const digest = inputsDigest(repo);
  if (process.argv.includes('--if-stale')) {
    const why = staleReason(repo, digest);
    if (!why) {
      console.error(`build: dist/ is up to date with src/ (inputs ${digest.slice(0, 12)}); not rebuilt`);
      process.exit(0);
    }
    console.error(`build: ${why}; building`);
  }
  build(repo, digest);
}
