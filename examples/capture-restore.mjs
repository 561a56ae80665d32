// Capture a set of memory regions into a store, wipe them, restore them, check the bytes.
// Runs anywhere: on a GPU machine the regions are device memory, elsewhere host memory.
//   npm run build && node examples/capture-restore.mjs [store-dir]
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cudaStatus, RamTier, RegionStore, Snapshot } from 'vsnap';
import { DeviceAllocation, HostRegion } from 'vsnap/plumbing';

const MiB = 1024 * 1024;
// The store: the directory given, else a temporary one removed at the end (the capture is 96 MiB).
const root = process.argv[2] ?? mkdtempSync(join(tmpdir(), 'vsnap-example-'));
const gpu = (await cudaStatus()).available;

// Two "weights" regions: GPU allocations when there is a GPU, memfd host memory otherwise.
const sizes = { 'model.embed_tokens.weight': 64 * MiB, 'model.layers.0.mlp.weight': 32 * MiB };
const regions = [];
for (const [key, size] of Object.entries(sizes)) {
  const owner = gpu ? await DeviceAllocation.allocate(0, size) : HostRegion.create(size);
  await owner.write(0, Buffer.from(`contents of ${key}`));
  regions.push({ key, size, memory: owner.memory, owner });
}

const store = await RegionStore.open(root);
const snap = await Snapshot.capture(store, 'example', {
  regions,
  model: { id: 'example/model' },
  onProgress: (p) => process.stderr.write(`\rcapture ${p.phase} ${p.bytesDone}/${p.bytesTotal}`),
});
process.stderr.write('\n');
console.log(`captured ${snap.name} ${snap.id}: ${snap.manifest.regionCount} regions, ${snap.manifest.totalBytes} bytes`);

for (const r of regions) await r.owner.write(0, Buffer.alloc(64)); // wipe the start

// Restore through the RAM tier: the first restore loads it (verified), later ones are pure DMA.
const ram = await RamTier.create({ budgetBytes: 128 * MiB });
for (const attempt of [1, 2]) {
  const result = await (await Snapshot.open(store, 'example')).restore({ regions, ram });
  console.log(`restore ${attempt}: ${result.bytes} bytes from the ${result.tier} tier in ${result.seconds.toFixed(3)} s`);
}
for (const r of regions) {
  const head = (await r.owner.read(0, 64)).toString().replace(/\0+$/, '');
  console.log(`${r.key}: "${head}"`);
}
ram.close();
for (const r of regions) r.owner.close();
if (!process.argv[2]) rmSync(root, { recursive: true, force: true });
