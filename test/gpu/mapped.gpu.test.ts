// GPU suite (device only): `npm run test:gpu -- dist-gpu/mapped.gpu.test.mjs` (or the whole suite).
// Issue 14, "no work twice" on real device memory: a restore through one MappedRegions set imports
// every exported region once (the hydrate and its GPU digest share the mapping), and the bytes
// come back bit-identical. Exported fds of this process's own allocations stand in for an
// engine's (cuMemImportFromShareableHandle does not care who exported them).
import assert from 'node:assert/strict';
import { closeSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

import { cudaStatus, DeviceAllocation, HostCache, MappedRegions, RegionStore, Snapshot } from '../../src/index.js';
import type { RegionMemory } from '../../src/index.js';
import { native } from '../../src/native/index.js';

const MiB = 1024 * 1024;

describe('MappedRegions on the GPU', async () => {
  const status = await cudaStatus();
  it('restores 300 regions from the RAM tier with one import each, verified by digest, bit-identical', { skip: !status.available }, async () => {
    const sizes = [...Array.from({ length: 299 }, () => 2 * MiB), 256 * MiB];
    const allocations = await Promise.all(sizes.map((s) => DeviceAllocation.allocate(0, s)));
    const fds = allocations.map((a) => a.exportFd());
    const root = mkdtempSync(join(tmpdir(), 'vsnap-mapped-'));
    const cache = await HostCache.create({ budgetBytes: 1024 * MiB });
    try {
      for (const [i, a] of allocations.entries()) await a.fill(0, a.size, (i * 7 + 1) & 0xff);
      const regions = allocations.map((a, i) => ({ key: `r${i}`, size: a.size, memory: { kind: 'imported', fd: fds[i]!, device: 0 } as RegionMemory }));
      const store = await RegionStore.open(root);
      const snap = await Snapshot.capture(store, 'mapped', { regions, cache });
      for (const a of allocations) await a.fill(0, a.size, 0);

      const before = native().regionCounters().imports;
      const set = await MappedRegions.open(regions);
      const result = await snap.restore({ regions: regions.map((r, i) => ({ ...r, memory: set.memory(i) })), cache });
      await set.close();
      assert.equal(native().regionCounters().imports - before, regions.length, 'one import per region for the hydrate and the digest together');
      assert.equal(result.tier, 'ram');
      assert.ok(result.digestSeconds !== undefined, 'the restore was verified by GPU digest');
      for (const [i, a] of allocations.entries()) {
        const head = await a.read(0, 4096);
        assert.ok(head.every((b) => b === ((i * 7 + 1) & 0xff)), `region ${i} restored`);
      }
    } finally {
      cache.close();
      for (const fd of fds) closeSync(fd);
      for (const a of allocations) a.close();
      rmSync(root, { recursive: true, force: true });
    }
  });
});
