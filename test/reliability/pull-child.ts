// Child process of the hostile-registry figures, bundled from src/ by bundle.ts: pulls one
// reference into a store and prints, as its last line, `result <json>`: the outcome (`ok` or the
// error code), the first line of the message, and its peak resident memory (VmHWM) before the
// pull (modules and the addon loaded) and after it.
// argv: <storeRoot> <reference> <registry options as JSON>
import { readFileSync } from 'node:fs';

import { native } from '../../src/native/index.js';
import { RegistryClient } from '../../src/registry/registry.js';
import type { RegistryOptions } from '../../src/registry/types.js';
import { RegionStore } from '../../src/store/region-store.js';

const [root, reference, optionsJson] = process.argv.slice(2) as [string, string, string];

function vmHwmKiB(): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) : -1;
}

async function main(): Promise<void> {
  native(); // the addon is part of the baseline, not of the pull
  const store = await RegionStore.open(root);
  const options = JSON.parse(optionsJson) as RegistryOptions;
  const baselineKiB = vmHwmKiB();
  let outcome = 'ok';
  let message = '';
  try {
    await new RegistryClient({ dockerConfig: false, ...options }).pull(store, reference);
  } catch (err) {
    const e = err as { code?: string; message?: string };
    outcome = e.code ?? `uncoded ${(err as Error).name}`;
    message = String(e.message ?? err).split('\n')[0]!.slice(0, 300);
  }
  process.stdout.write(`result ${JSON.stringify({ outcome, message, baselineKiB, peakKiB: vmHwmKiB() })}\n`);
}

main().catch((err: unknown) => {
  process.stdout.write(`result ${JSON.stringify({ outcome: 'crashed', message: String(err), baselineKiB: -1, peakKiB: vmHwmKiB() })}\n`);
  process.exitCode = 1;
});
