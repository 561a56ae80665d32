// Per-region cost of a RAM-tier restore (issue 14): the same bytes split into 36, 252, 1,000 and
// 4,000 regions, restored from the RAM tier and verified by digest, three ways:
//   per-op:      every operation maps the regions itself (the hydrate, then the digest again);
//   per-region:  one MappedRegions set serves both, each region reserved, mapped and made
//                accessible on its own (the form restoreEngine used before the batched one);
//   batched:     one MappedRegions set, one address reservation and one cuMemSetAccess per
//                device, each allocation mapped at its offset (native/transfer/region_batch.h);
//   pipelined:   batched in growing chunks on a background thread while the restore's copy runs
//                on the regions already mapped (native/transfer/region_pipeline.h).
// For both set forms it prints where the open and the close spend their time, per VMM step
// (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemUnmap,
// cuMemAddressFree, cuMemRelease, close(fd); native/cuda/vmm_timing.h), summed over threads.
// Usage:  npx tsx bench/region-count.ts [MiB] [host|cuda] [repeats]
//   host: memfd regions (the CPU backend; runs anywhere); cuda: device memory of GPU 0, exported
//   and imported back as another process's memory would be.
//   VSNAP_BENCH_JSON=<file>: also writes every measurement there.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { HostCache } from '../src/cache/host-cache.js';
import { DeviceAllocation } from '../src/gpu/device-allocation.js';
import { native, type NativeVmmStep, type NativeVmmTimings } from '../src/native/index.js';
import { HostRegion } from '../src/regions/host-region.js';
import { MappedRegions } from '../src/regions/mapped.js';
import type { RegionMemory } from '../src/regions/memory.js';
import { Snapshot } from '../src/snapshot/snapshot.js';
import { RegionStore } from '../src/store/region-store.js';
import { vmmSince } from '../test/helpers/vmm.js';

const mib = Number(process.argv[2] ?? 256);
const backend = (process.argv[3] ?? 'host') as 'host' | 'cuda';
const repeats = Number(process.argv[4] ?? 5);
const counts = [36, 252, 1000, 4000];
const total = mib * 1024 * 1024;
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const forms = ['per-region', 'batched', 'pipelined'] as const;
type Form = (typeof forms)[number];
const steps: NativeVmmStep[] = ['import', 'props', 'setup', 'reserve', 'map', 'access', 'unmap', 'addressFree', 'release', 'closeFd'];
type Steps = NativeVmmTimings;

interface FormRun {
  total: number[]; // open + restore (hydrate and digest) + close, seconds
  open: number[];
  restore: number[];
  close: number[];
  copy: number[];
  digest: number[];
  steps: Steps[]; // per rep, open and close together
  mappings: string[];
}

async function regionsOf(n: number): Promise<{ regions: Array<{ key: string; size: number; memory: RegionMemory }>; exportSeconds: number; close(): void }> {
  // Multiples of the 2 MiB VMM granularity where the split allows, else of 4 KiB pages.
  const size = Math.floor(total / n / (2 << 20)) * (2 << 20) || Math.max(4096, Math.floor(total / n / 4096) * 4096);
  const closers: Array<() => void> = [];
  const regions = [];
  let exportSeconds = 0;
  for (let i = 0; i < n; i++) {
    if (backend === 'host') {
      const r = HostRegion.create(size);
      closers.push(() => r.close());
      regions.push({ key: `r${i}`, size, memory: { kind: 'host', fd: r.fd } as RegionMemory });
    } else {
      const a = await DeviceAllocation.allocate(0, size);
      const t = performance.now();
      const fd = a.exportFd();
      exportSeconds += (performance.now() - t) / 1000;
      closers.push(() => a.close());
      regions.push({ key: `r${i}`, size, memory: { kind: 'imported', fd, device: 0 } as RegionMemory });
    }
  }
  return { regions, exportSeconds, close: () => closers.forEach((c) => c()) };
}

const results: Array<{ regions: number; size: number; exportSeconds: number; perOp: number[]; forms: Record<Form, FormRun> }> = [];
const root = mkdtempSync(join(tmpdir(), 'vsnap-regions-'));
try {
  const store = await RegionStore.open(root);
  const cache = await HostCache.create({ budgetBytes: total + 64 * 1024 * 1024, pin: backend === 'cuda' });
  try {
    for (const n of counts) {
      const { regions, exportSeconds, close } = await regionsOf(n);
      try {
        const snap = await Snapshot.capture(store, `n${n}`, { regions, cache, persist: 'off' });
        const perOp: number[] = [];
        const runs = {} as Record<Form, FormRun>;
        for (const f of forms) runs[f] = { total: [], open: [], restore: [], close: [], copy: [], digest: [], steps: [], mappings: [] };
        // One unmeasured warm-up of each form, then the reps, the forms interleaved.
        for (let k = -1; k < repeats; k++) {
          let t = performance.now();
          await snap.restore({ regions, cache });
          if (k >= 0) perOp.push((performance.now() - t) / 1000);
          for (const f of forms) {
            const before = native().vmmTimings();
            t = performance.now();
            const set = await MappedRegions.open(regions, { mapping: f });
            const tMap = performance.now();
            const r = await snap.restore({ regions: regions.map((x, i) => ({ ...x, memory: set.memory(i) })), cache });
            const tDone = performance.now();
            await set.close();
            const tClosed = performance.now();
            if (k < 0) continue;
            const run = runs[f];
            run.total.push((tClosed - t) / 1000);
            run.open.push((tMap - t) / 1000);
            run.restore.push((tDone - tMap) / 1000);
            run.close.push((tClosed - tDone) / 1000);
            run.copy.push(r.seconds);
            run.digest.push(r.digestSeconds ?? 0);
            run.steps.push(vmmSince(before));
            run.mappings.push(set.mapping);
          }
        }
        results.push({ regions: n, size: regions[0]!.size, exportSeconds, perOp, forms: runs });
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

const ms = (s: number): string => (s * 1000).toFixed(1);
const first = results[0]!;
console.log(`backend ${backend}, ${mib} MiB, median of ${repeats} after one warm-up; ms. A form's total = open the set + restore (hydrate + GPU digest) + close the set.`);
console.log('"vs first": against the same form at the first count (the issue-14 target: <= 1.10x); open / restore / close: the set\'s open, the restore through it (hydrate + digest), its close.');
console.log(['regions', 'bytes/region', 'export fds', 'per-op', ...forms.flatMap((f) => [f, 'vs first', `${f} open/restore/close`])].join('\t'));
for (const r of results) {
  const cells = forms.flatMap((f) => {
    const run = r.forms[f];
    return [ms(median(run.total)), (median(run.total) / median(first.forms[f].total)).toFixed(3) + 'x', `${ms(median(run.open))}/${ms(median(run.restore))}/${ms(median(run.close))}`];
  });
  console.log([r.regions, r.size, ms(r.exportSeconds), ms(median(r.perOp)), ...cells].join('\t'));
}
console.log('\nVMM steps per open + close, mean over the reps: ms summed over threads (calls / regions covered).');
console.log(['regions', 'form', ...steps].join('\t'));
for (const r of results) {
  for (const f of forms) {
    const run = r.forms[f];
    const mean = (k: NativeVmmStep, field: 'calls' | 'items' | 'seconds'): number => run.steps.reduce((a, s) => a + s[k][field], 0) / run.steps.length;
    const used = run.mappings.every((m) => m === run.mappings[0]) ? run.mappings[0] : run.mappings.join('/');
    console.log([r.regions, f === used ? f : `${f} (fell back: ${used})`, ...steps.map((k) => `${ms(mean(k, 'seconds'))} (${Math.round(mean(k, 'calls'))}/${Math.round(mean(k, 'items'))})`)].join('\t'));
  }
}
const out = process.env['VSNAP_BENCH_JSON'];
if (out) writeFileSync(out, JSON.stringify({ backend, mib, repeats, results }, null, 2));
