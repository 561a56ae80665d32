#!/usr/bin/env node
// Keeps the committed prebuild in step with native/: the sha256 of binding.gyp and every file
// under native/ is recorded beside the prebuild when it is built (`npm run build:native` runs
// this with --write); CI runs it without --write and fails when the sources changed since.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const record = join(root, 'prebuilds', 'SOURCES.sha256');

function files(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)],
  );
}

const inputs = [join(root, 'binding.gyp'), ...files(join(root, 'native'))]
  .map((p) => relative(root, p).split('\\').join('/'))
  .sort();
const hash = createHash('sha256');
for (const rel of inputs) {
  hash.update(`${rel}\n`);
  hash.update(readFileSync(join(root, rel)));
  hash.update('\n');
}
const digest = hash.digest('hex');

if (process.argv.includes('--write')) {
  writeFileSync(record, `${digest}\n`);
  console.log(`recorded native source hash ${digest} in ${relative(root, record)}`);
  process.exit(0);
}

const prebuilt = join(root, 'prebuilds', 'linux-x64');
const binaries = existsSync(prebuilt) ? readdirSync(prebuilt).filter((f) => f.endsWith('.node')) : [];
const recorded = existsSync(record) ? readFileSync(record, 'utf8').trim() : '(none)';
if (binaries.length === 0 || recorded !== digest) {
  console.error(
    binaries.length === 0
      ? 'prebuilds/linux-x64 has no .node binary.'
      : `native/ or binding.gyp changed since the committed prebuild was built\n  recorded: ${recorded}\n  sources:  ${digest}`,
  );
  console.error('Rebuild and commit it: `npm run build:native` (needs g++, make, python3, cuda.h and libxxhash-dev).');
  process.exit(1);
}
console.log(`prebuild is in step with native/ (${digest.slice(0, 12)})`);
