#!/usr/bin/env node
// The vLLM plugin runs vsnap's digest kernel in the engine over its own weights
// (engines/vllm/vsnap_vllm/gd1.py, drivers.py): it ships the fatbin that native/digest/digest_kernel.inc
// embeds, as engines/vllm/vsnap_vllm/digest_kernel.fatbin (the plugin is installed on its own,
// without native/). This writes that copy from the .inc, or with --check says whether it is the
// same bytes (test/unit/digest.test.ts runs the check). Run it after node native/gen-kernel.mjs digest.
//   node scripts/plugin-kernel.mjs            (writes)   --check  (exit 1 when it differs)
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const inc = `${root}native/digest/digest_kernel.inc`;
const copy = `${root}engines/vllm/vsnap_vllm/digest_kernel.fatbin`;

/** The fatbin's bytes, as the .inc holds them (its one `0x..` array). */
export function incBytes() {
  const text = readFileSync(inc, 'utf8');
  return Buffer.from((text.slice(text.indexOf('{') + 1, text.lastIndexOf('}')).match(/0x[0-9a-f]{2}/g) ?? []).map((x) => parseInt(x, 16)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const bytes = incBytes();
  if (process.argv.includes('--check')) {
    let same = false;
    try {
      same = readFileSync(copy).equals(bytes);
    } catch {
      same = false;
    }
    console.log(same ? `the plugin's digest_kernel.fatbin is the .inc's fatbin (${bytes.length} bytes)` : "the plugin's digest_kernel.fatbin differs from native/digest/digest_kernel.inc: run node scripts/plugin-kernel.mjs");
    process.exit(same ? 0 : 1);
  }
  writeFileSync(copy, bytes);
  console.log(`wrote ${copy} (${bytes.length} bytes)`);
}
