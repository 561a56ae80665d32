#!/usr/bin/env node
// Keeps the committed prebuilds in step with native/: the sha256 of binding.gyp and every file
// under native/ is recorded beside the prebuilds when they are built (`npm run build:native`
// runs this with --write); CI runs it without --write and fails when the sources changed since.
// It also holds every prebuild to what vLLM's images (Ubuntu 22.04) provide: glibc <= 2.35,
// libstdc++ of GCC 11 (GLIBCXX <= 3.4.29, CXXABI <= 1.3.13), no other libraries, and the right
// machine for its directory; and records what each needs in prebuilds/REQUIREMENTS.json, which
// the loader quotes when a binary will not load.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

import { compareVersions, elfNeeds, highest } from './elf-versions.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const record = join(root, 'prebuilds', 'SOURCES.sha256');
const requirementsFile = join(root, 'prebuilds', 'REQUIREMENTS.json');
const ARCHES = { x64: 62, arm64: 183 }; // ELF e_machine: EM_X86_64, EM_AARCH64
const LIMITS = { GLIBC_: '2.35', GLIBCXX_: '3.4.29', CXXABI_: '1.3.13' };
const ALLOWED_LIBS = new Set(['libc.so.6', 'libstdc++.so.6', 'libgcc_s.so.1', 'libm.so.6', 'libdl.so.2', 'libpthread.so.0',
  'ld-linux-x86-64.so.2', 'ld-linux-aarch64.so.1']);

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

// Every problem with the committed binaries, and what each needs.
function inspect() {
  const problems = [];
  const requirements = {};
  for (const [arch, machine] of Object.entries(ARCHES)) {
    const dir = join(root, 'prebuilds', `linux-${arch}`);
    const binaries = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.node')) : [];
    if (binaries.length === 0) problems.push(`prebuilds/linux-${arch} has no .node binary.`);
    for (const file of binaries) {
      const rel = `prebuilds/linux-${arch}/${file}`;
      const needs = elfNeeds(join(dir, file));
      if (needs.machine !== machine) problems.push(`${rel} is built for ELF machine ${needs.machine}, not ${arch}`);
      for (const lib of needs.needed) if (!ALLOWED_LIBS.has(lib)) problems.push(`${rel} links ${lib}, which vLLM's images need not have`);
      const found = { glibc: highest(needs, 'GLIBC_'), glibcxx: highest(needs, 'GLIBCXX_'), cxxabi: highest(needs, 'CXXABI_') };
      for (const [prefix, limit] of Object.entries(LIMITS)) {
        const v = highest(needs, prefix);
        if (v && compareVersions(v, limit) > 0) problems.push(`${rel} needs ${prefix}${v}, newer than ${prefix}${limit}`);
      }
      requirements[`linux-${arch}`] = found;
    }
  }
  return { problems, requirements };
}

if (process.argv.includes('--write')) {
  const { problems, requirements } = inspect();
  if (problems.length > 0) {
    console.error(problems.join('\n'));
    process.exit(1);
  }
  writeFileSync(requirementsFile, `${JSON.stringify(requirements, null, 2)}\n`);
  writeFileSync(record, `${digest}\n`);
  console.log(`recorded native source hash ${digest} in ${relative(root, record)}`);
  process.exit(0);
}

const recorded = existsSync(record) ? readFileSync(record, 'utf8').trim() : '(none)';
const { problems, requirements } = inspect();
if (recorded !== digest) {
  problems.push(`native/ or binding.gyp changed since the committed prebuilds were built\n  recorded: ${recorded}\n  sources:  ${digest}`);
}
const written = existsSync(requirementsFile) ? readFileSync(requirementsFile, 'utf8') : '';
if (problems.length === 0 && written !== `${JSON.stringify(requirements, null, 2)}\n`) {
  problems.push('prebuilds/REQUIREMENTS.json does not describe the committed binaries');
}
if (problems.length > 0) {
  console.error(problems.join('\n'));
  console.error(
    'Rebuild and commit them: `npm run build:native` (needs g++, make, python3, cuda.h, libxxhash-dev and, for arm64, g++-aarch64-linux-gnu).',
  );
  process.exit(1);
}
const summary = Object.entries(requirements).map(([k, v]) => `${k}: glibc ${v.glibc}, GLIBCXX ${v.glibcxx}`).join('; ');
console.log(`prebuilds are in step with native/ (${digest.slice(0, 12)}); ${summary}`);
