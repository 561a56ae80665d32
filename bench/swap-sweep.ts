// The `sweep` row of `npm run bench -- swap`, before the engines start: the same bytes in 36 to 4,000
// near-equal regions, captured into the RAM tier and restored from it into this process's device
// allocations and through exported fds (as a restore maps an engine's regions), beside the raw
// pinned H2D of the same regions (bench/ceiling.cu), same run. Not the engine: PyTorch's caching
// allocator gives every request under 10 MiB a shared 20 MiB segment, so 16 GiB in 4,000 own
// segments cannot be made there; a device allocation per region is what a region is to a copy.
import { execFileSync } from 'node:child_process';
import { closeSync, existsSync } from 'node:fs';

import { RamTier, type RegionMemory, type RegionStore, Snapshot, type TransferSummary } from '../src/index.js';
import { DeviceAllocation, HostRegion, MappedRegions } from '../src/plumbing.js';
import { gbps, GiB, median, MiB, since } from './common.js';
import type { Ceiling, SweepRow } from './swap-report.js';

/** `count` near-equal region sizes of `granule`-multiples that add up to `total` (rounded down to a granule). */
export function splitEvenly(total: number, count: number, granule: number): number[] {
  const units = Math.floor(total / granule);
  if (count < 1 || units < count) throw new Error(`cannot split ${total} bytes into ${count} regions of at least ${granule} bytes`);
  const base = Math.floor(units / count);
  const extra = units % count;
  return Array.from({ length: count }, (_, i) => (base + (i < extra ? 1 : 0)) * granule);
}

/**
 * Raw cudaMemcpy between pinned memory and cudaMalloc'd buffers of these sizes (bench/ceiling.cu);
 * null without the binary. Measured twice, the host memory in small pages and in huge ones (the RAM
 * tier's are huge where the kernel gives them), and each direction's best taken: the ceiling is
 * the faster of the two, `pages` says which gave it and `variants` holds both.
 */
export function runCeiling(bin: string | null, sizes: readonly number[], reps: number): Ceiling | null {
  if (!bin || !existsSync(bin)) return null;
  const one = (pages: 'small' | 'huge'): Ceiling => JSON.parse(execFileSync(bin, [String(reps), '--pages', pages, ...sizes.map(String)], { encoding: 'utf8', maxBuffer: 1 << 20 })) as Ceiling;
  const small = one('small');
  const huge = one('huge');
  const h2d = huge.h2dGBps.max > small.h2dGBps.max ? huge : small;
  const d2h = huge.d2hGBps.max > small.d2hGBps.max ? huge : small;
  return { ...small, h2dGBps: h2d.h2dGBps, d2hGBps: d2h.d2hGBps, pages: `H2D ${h2d.pages} pages, D2H ${d2h.pages}`, variants: [small, huge] };
}

type Region = { key: string; size: number; memory: RegionMemory };

/** One region per size, filled with distinct bytes (no dedupe between regions): device allocations (region i on GPU i % devices), or memfds on the host. */
export async function makeRegions(device: 'cuda' | 'host', sizes: readonly number[], devices = 1): Promise<{ regions: Region[]; close(): void }> {
  const closers: Array<() => void> = [];
  const regions: Region[] = [];
  const close = (): void => {
    for (const c of closers.splice(0).reverse()) c();
  };
  try {
    for (const [i, size] of sizes.entries()) {
      const value = (i * 37 + 1) & 0xff;
      let memory: RegionMemory;
      if (device === 'cuda') {
        const a = await DeviceAllocation.allocate(i % devices, size);
        closers.push(() => a.close());
        await a.fill(0, size, value);
        memory = { kind: 'device', allocation: a };
      } else {
        const r = HostRegion.create(size, `vsnap-bench-${i}`);
        closers.push(() => r.close());
        r.write(0, Buffer.alloc(size, value));
        memory = r.memory;
      }
      regions.push({ key: `model.layers.${i}.weight`, size, memory });
    }
  } catch (err) {
    close();
    throw err;
  }
  return { regions, close };
}

/** A restore from the RAM tier, which it must come from. */
async function restoreFromRam(snap: Snapshot, regions: Region[], cache: RamTier, what: string): Promise<TransferSummary> {
  const res = await snap.restore({ regions, ram: cache });
  if (res.tier !== 'ram') throw new Error(`[sweep] ${what}: restored from ${res.tier ?? 'store'}, expected the RAM tier`);
  return res;
}

/** The restores through exported fds (SweepRow.imported), after one warm-up: the set is closed after the clock; pipelined, the copy starts on the first regions while the rest are mapped. */
async function restoreViaFds(snap: Snapshot, held: Region[], cache: RamTier, reps: number): Promise<Omit<NonNullable<SweepRow['imported']>, 'vsFirst' | 'vsCeiling'>> {
  const fds: number[] = [];
  try {
    const t = performance.now();
    for (const r of held) if (r.memory.kind === 'device') fds.push(r.memory.allocation.exportFd());
    const exportSeconds = since(t);
    const viaFds = held.map((r, i) => ({ key: r.key, size: r.size, memory: { kind: 'imported' as const, fd: fds[i]!, device: 0 } }));
    const restoreSeconds: number[] = [];
    const phases = { openSeconds: [] as number[], copySeconds: [] as number[], issuedToLandedSeconds: [] as number[], digestSeconds: [] as number[] };
    for (let r = 0; r <= reps; r++) {
      const t0 = performance.now();
      const set = await MappedRegions.open(viaFds, { mapping: 'pipelined' });
      const opened = since(t0);
      try {
        const res = await restoreFromRam(snap, viaFds.map((x, i) => ({ ...x, memory: set.memory(i) })), cache, `${held.length} imported regions`);
        if (r === 0) continue;
        restoreSeconds.push(since(t0));
        phases.openSeconds.push(opened);
        phases.copySeconds.push(res.seconds);
        phases.issuedToLandedSeconds.push(res.devices?.[0]?.hydrateSeconds ?? res.seconds);
        phases.digestSeconds.push(res.digestSeconds ?? 0);
      } finally {
        await set.close();
      }
    }
    return { exportSeconds, restoreSeconds, restoreMedianSeconds: median(restoreSeconds), phases };
  } finally {
    for (const fd of fds) closeSync(fd);
  }
}

export interface SweepOptions {
  device: 'cuda' | 'host';
  totalBytes: number;
  counts: readonly number[];
  reps: number;
  ceilingBin: string | null;
  store: RegionStore;
  log: (message: string) => void;
}

/** The region-count sweep: one pinned RAM tier for all counts, each count captured into it, restored `reps` times, evicted. */
export async function runSweep(o: SweepOptions): Promise<{ rows: SweepRow[]; cacheCreateSeconds: number; ceilingNote: string | null }> {
  const granule = o.device === 'cuda' ? 2 * MiB : 4096;
  const layouts = o.counts.map((n) => splitEvenly(o.totalBytes, n, granule));
  const budget = Math.max(...layouts.map((s) => s.reduce((a, b) => a + b, 0))) + 64 * MiB;
  const t = performance.now();
  const cache = await RamTier.create({ budgetBytes: budget, pin: o.device === 'cuda' });
  const cacheCreateSeconds = since(t);
  o.log(`[sweep] RAM tier of ${(budget / GiB).toFixed(2)} GiB (${cache.pinned ? 'pinned' : 'not pinned'}) in ${cacheCreateSeconds.toFixed(2)} s`);
  const rows: SweepRow[] = [];
  const ceilingNote = o.ceilingBin && existsSync(o.ceilingBin) ? null : `no ceiling binary${o.ceilingBin ? ` at ${o.ceilingBin}` : ''} (bench/run.sh builds it with nvcc)`;
  const ms = (s: number): string => (s * 1000).toFixed(1);
  try {
    for (const sizes of layouts) {
      const bytes = sizes.reduce((a, b) => a + b, 0);
      // The ceiling first, in its own process: its buffers are gone before vsnap allocates.
      const ceiling = o.device === 'cuda' ? runCeiling(o.ceilingBin, sizes, o.reps) : null;
      /** A median against the first count's and against this layout's raw pinned H2D. */
      const against = (s: number, first: number | undefined) => ({ vsFirst: first ? s / first : 1, vsCeiling: ceiling ? gbps(bytes, s) / ceiling.h2dGBps.max : null });
      const t0 = performance.now();
      const held = await makeRegions(o.device, sizes);
      const setupSeconds = since(t0);
      let snap: Snapshot | undefined;
      try {
        snap = await Snapshot.capture(o.store, `sweep-${sizes.length}`, { regions: held.regions, ram: cache, persist: 'off' });
        const restoreSeconds: number[] = [];
        for (let r = 0; r <= o.reps; r++) {
          const res = await restoreFromRam(snap, held.regions, cache, `${sizes.length} regions`);
          if (r > 0) restoreSeconds.push(res.seconds); // the first is a warm-up (first touch of the mappings)
        }
        const m = median(restoreSeconds);
        let imported: SweepRow['imported'] = null;
        let importedError: string | null = null;
        if (o.device === 'cuda') {
          try {
            const fds = await restoreViaFds(snap, held.regions, cache, o.reps);
            imported = { ...fds, ...against(fds.restoreMedianSeconds, rows[0]?.imported?.restoreMedianSeconds) };
            const p = (v: number[]): string => ms(median(v));
            o.log(`[sweep] ${sizes.length} regions via fds: ${ms(fds.restoreMedianSeconds)} ms (open ${p(fds.phases.openSeconds)}, copy ${p(fds.phases.copySeconds)} of which first issued to landed ${p(fds.phases.issuedToLandedSeconds)}, digest waited ${p(fds.phases.digestSeconds)})`);
          } catch (err) {
            importedError = (err as Error).message.split('\n')[0]!;
            o.log(`[sweep] ${sizes.length} regions via fds failed (the mapped row stands): ${importedError}`);
          }
        }
        const [minRegionBytes, maxRegionBytes] = [Math.min(...sizes), Math.max(...sizes)];
        const row: SweepRow = { regions: sizes.length, bytes, minRegionBytes, maxRegionBytes, setupSeconds, captureSeconds: snap.lastCapture!.seconds, restoreSeconds, restoreMedianSeconds: m, restoreGBps: gbps(bytes, m), ceiling, ...against(m, rows[0]?.restoreMedianSeconds), imported, importedError };
        rows.push(row);
        o.log(
          `[sweep] ${sizes.length} regions of ${(minRegionBytes / MiB).toFixed(1)}-${(maxRegionBytes / MiB).toFixed(1)} MiB: restore ${ms(m)} ms ` +
            `(${row.restoreGBps.toFixed(2)} GB/s, ${row.vsFirst!.toFixed(3)}x of ${rows[0]!.regions} regions${ceiling ? `, ${row.vsCeiling!.toFixed(3)}x of raw H2D ${ceiling.h2dGBps.max} GB/s` : ''}); ` +
            (imported ? `via fds: export ${ms(imported.exportSeconds)} ms, restore ${ms(imported.restoreMedianSeconds)} ms (${imported.vsFirst!.toFixed(3)}x); ` : '') +
            `setup ${setupSeconds.toFixed(1)} s`,
        );
      } finally {
        if (snap) cache.evict(snap.id);
        held.close();
      }
    }
  } finally {
    cache.close();
  }
  return { rows, cacheCreateSeconds, ceilingNote };
}
