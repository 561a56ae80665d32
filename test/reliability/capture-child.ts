// Child process of the kill -9 trials, bundled from src/ by bundle.ts (a lean bundle starts fast):
// captures three host regions filled with a seeded pattern into a store, printing `started`
// before the capture and `published <id>` after. TEST_FAILPOINT_AT=n makes it SIGKILL itself at
// the n-th failpoint reached (test/helpers/failpoints.mjs).
// argv: <storeRoot> <name> <seed> <regionBytes>
import { createCipheriv, createHash } from 'node:crypto';

import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { installFailpoints } from '../helpers/failpoints.mjs';

const [root, name, seed, regionBytes] = process.argv.slice(2) as [string, string, string, string];
installFailpoints(process.env);

function pattern(key: string, length: number): Buffer {
  const k = createHash('sha256').update(key).digest().subarray(0, 16);
  return createCipheriv('aes-128-ctr', k, Buffer.alloc(16)).update(Buffer.alloc(length));
}

async function main(): Promise<void> {
  const size = Number(regionBytes);
  const regions = [0, 1, 2].map((i) => {
    const r = HostRegion.create(size);
    r.write(0, pattern(`${seed}/${i}`, size));
    return { key: `layer.${i}`, size, memory: r.memory };
  });
  const store = await RegionStore.open(root, { spaceMarginBytes: 0 });
  if (process.env.VSNAP_CHILD_WAIT) {
    // wait for the parent (which sets limits on this process) to say go
    process.stdout.write('ready\n');
    await new Promise<void>((resolve) => process.stdin.once('data', () => resolve()));
    process.stdin.destroy();
  }
  process.stdout.write('started\n');
  const snap = await Snapshot.capture(store, name, { regions, chunkSize: 64 * 1024, threads: 2 });
  process.stdout.write(`published ${snap.id}\n`);
}

main().catch((err: unknown) => {
  const e = err as { code?: string; message?: string };
  process.stdout.write(`failed ${e.code ?? 'no-code'} ${JSON.stringify(e.message ?? String(err))}\n`);
  process.exitCode = 1;
});
