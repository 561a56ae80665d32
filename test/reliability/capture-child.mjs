// Child process of the kill -9 trials: captures three host regions filled with a seeded pattern
// into a store through the built package (dist/), printing `started` before the capture and
// `published <id>` after. VSNAP_FAILPOINT_AT=n makes it SIGKILL itself at the n-th failpoint.
// argv: <storeRoot> <name> <seed> <regionBytes>
import { createCipheriv, createHash } from 'node:crypto';

import { HostRegion, RegionStore, Snapshot } from '../../dist/index.js';

const [root, name, seed, regionBytes] = process.argv.slice(2);

function pattern(key, length) {
  const k = createHash('sha256').update(key).digest().subarray(0, 16);
  return createCipheriv('aes-128-ctr', k, Buffer.alloc(16)).update(Buffer.alloc(length));
}

const size = Number(regionBytes);
const regions = [0, 1, 2].map((i) => {
  const r = HostRegion.create(size);
  r.write(0, pattern(`${seed}/${i}`, size));
  return { key: `layer.${i}`, size, memory: r.memory };
});
const store = await RegionStore.open(root, { spaceMarginBytes: 0 });
process.stdout.write('started\n');
const snap = await Snapshot.capture(store, name, { regions, chunkSize: 64 * 1024, threads: 2 });
process.stdout.write(`published ${snap.id}\n`);
