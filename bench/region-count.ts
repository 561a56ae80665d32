// Per-region cost of a RAM-tier restore (issue 14): the same bytes split into 36, 252, 1,000 and
// 4,000 regions, restored from the RAM tier and verified by digest, two ways:
//   per-op:  every operation maps the regions itself (the hydrate, then the digest again);
//   mapped:  one MappedRegions set (opened on a few threads) serves both, unmapped off-thread.
// Usage:  npx tsx bench/region-count.ts [MiB] [host|cuda] [repeats]
//   host: memfd regions (the CPU backend; runs anywhere); cuda: device memory of GPU 0, exported
//   and imported back as another process's memory would be.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { HostCache } from '../src/cache/host-cache.js';
import { DeviceAllocation } from '../src/gpu/device-allocation.js';
import { HostRegion } from '../src/regions/host-region.js';
import { MappedRegions } from '../src/regions/mapped.js';
import type { RegionMemory } from '../src/regions/memory.js';
import { Snapshot } from '../src/snapshot/snapshot.js';
import { RegionStore } from '../src/store/region-store.js';

const mib = Number(process.argv[2] ?? 256);
const backend = (process.argv[3] ?? 'host') as 'host' | 'cuda';
const repeats = Number(process.argv[4] ?? 5);
const counts = [36, 252, 1000, 4000];
const total = mib * 1024 * 1024;
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function regionsOf(n: number): Promise<{ regions: Array<{ key: string; size: number; memory: RegionMemory }>; close(): void }> {
  // Multiples of the 2 MiB VMM granularity where the split allows, else of 4 KiB pages.
  const size = Math.floor(total / n / (2 << 20)) * (2 << 20) || Math.max(4096, Math.floor(total / n / 4096) * 4096);
  const closers: Array<() => void> = [];
  const regions = [];
  for (let i = 0; i < n; i++) {
    if (backend === 'host') {
      const r = HostRegion.create(size);
      closers.push(() => r.close());
      regions.push({ key: `r${i}`, size, memory: { kind: 'host', fd: r.fd } as RegionMemory });
    } else {
      const a = await DeviceAllocation.allocate(0, size);
      const fd = a.exportFd();
      closers.push(() => a.close());
      regions.push({ key: `r${i}`, size, memory: { kind: 'imported', fd, device: 0 } as RegionMemory });
    }
  }
  return { regions, close: () => closers.forEach((c) => c()) };
}

const rows: string[] = [];
const root = mkdtempSync(join(tmpdir(), 'vsnap-regions-'));
try {
  const store = await RegionStore.open(root);
  const cache = await HostCache.create({ budgetBytes: total + 64 * 1024 * 1024, pin: backend === 'cuda' });
  try {
    for (const n of counts) {
      const { regions, close } = await regionsOf(n);
      try {
        const snap = await Snapshot.capture(store, `n${n}`, { regions, cache, persist: 'off' });
        const perOp: number[] = [];
        const mapped: number[] = [];
        const phases: Record<string, number[]> = { map: [], copy: [], digest: [] };
        for (let k = 0; k < repeats; k++) {
          let t = performance.now();
          await snap.restore({ regions, cache });
          perOp.push((performance.now() - t) / 1000);
          t = performance.now();
          const set = await MappedRegions.open(regions);
          const tMap = performance.now();
          const r = await snap.restore({ regions: regions.map((x, i) => ({ ...x, memory: set.memory(i) })), cache });
          const tDone = performance.now();
          await set.close();
          mapped.push((tDone - t) / 1000);
          phases.map!.push((tMap - t) / 1000);
          phases.copy!.push(r.seconds);
          phases.digest!.push(r.digestSeconds ?? 0);
        }
        rows.push(
          [n, regions[0]!.size, median(perOp).toFixed(4), median(mapped).toFixed(4), median(phases.map!).toFixed(4), median(phases.copy!).toFixed(4), median(phases.digest!).toFixed(4)].join('\t'),
        );
        await snap.store.remove(`n${n}`).catch(() => undefined);
        try {
          cache.evict(snap.id);
        } catch {
          // still leased or the only copy: the next capture finds room or goes to the store
        }
      } finally {
        close();
      }
    }
  } finally {
    cache.close();
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
console.log(`backend ${backend}, ${mib} MiB, median of ${repeats}; seconds (the mapped path's unmap runs after, off the JS thread)`);
console.log(['regions', 'bytes/region', 'per-op', 'mapped', 'mapped:map', 'mapped:copy', 'mapped:digest'].join('\t'));
for (const r of rows) console.log(r);
