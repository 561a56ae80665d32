// Transfer-level rows of `npm run bench -- swap` (issue 14), run before the engines start:
//   sweep     the same bytes split into 36, 252, 1,000 and 4,000 near-equal regions, captured into
//             the RAM tier and restored from it (Snapshot.restore, the hydrate inside restoreEngine),
//             beside the raw pinned H2D of the same regions (bench/ceiling.cu) measured in the same run
//   capture2  (bench/capture-two-gpu.ts) capture into the RAM tier on two GPUs at once vs
//             both GPUs' aggregate raw D2H, hashed and with the hash deferred
// Why not the engine: the reference engine's regions are its allocator's segments, and PyTorch's
// caching allocator gives every request under 10 MiB a shared 20 MiB segment; 16 GiB in 4,000
// own segments (4.2 MiB each) cannot be made from it, so the sweep is run on device allocations
// (src/gpu/device-allocation.ts), one per region, which is what a region is to the transfer engine.
import { execFileSync } from 'node:child_process';
import { closeSync, existsSync } from 'node:fs';

import { HostCache, type RegionMemory, type RegionStore, Snapshot } from '../src/index.js';
import { DeviceAllocation, HostRegion, MappedRegions } from '../src/plumbing.js';
import { restoreMapping } from '../src/flows/restore-run.js';
import { firstRegions, makeFillMemory, makeFillMemoryInParts, type FillMemory } from '../src/flows/fill.js';
import { Batches } from '../src/snapshot/batches.js';
import type { RestoreRegion } from '../src/snapshot/snapshot-types.js';
import { median } from './swap-report.js';
import { regionId } from '../src/manifest/region-id.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

export type Log = (message: string) => void;
type Memory = RegionMemory;
interface Held {
  regions: Array<{ key: string; size: number; memory: Memory }>;
  close(): void;
}

export interface Ceiling {
  bytes: number;
  regions: number;
  devices: number;
  pinSeconds: number;
  h2dGBps: { max: number; median: number };
  d2hGBps: { max: number; median: number };
  /** The host memory's pages: small or huge (one run), or which gave each direction's best (runCeiling). */
  pages?: string;
  /** Bytes of the host memory the kernel backed with huge pages (one run). */
  hugeBytes?: number;
  /** Each run runCeiling took the best of. */
  variants?: Ceiling[];
}

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
export function runCeiling(bin: string | null, sizes: readonly number[], reps: number, devices = 1): Ceiling | null {
  if (!bin || !existsSync(bin)) return null;
  const one = (pages: 'small' | 'huge'): Ceiling => {
    const args = [String(reps), ...(devices > 1 ? ['--devices', String(devices)] : []), '--pages', pages, ...sizes.map(String)];
    return JSON.parse(execFileSync(bin, args, { encoding: 'utf8', maxBuffer: 1 << 20 })) as Ceiling;
  };
  const small = one('small');
  const huge = one('huge');
  const h2d = huge.h2dGBps.max > small.h2dGBps.max ? huge : small;
  const d2h = huge.d2hGBps.max > small.d2hGBps.max ? huge : small;
  return { ...small, h2dGBps: h2d.h2dGBps, d2hGBps: d2h.d2hGBps, pages: `H2D ${h2d.pages} pages, D2H ${d2h.pages}`, variants: [small, huge] };
}

/** One region per size, filled with distinct bytes (no dedupe between regions); on GPU i % devices, or memfds on the host. */
export async function makeRegions(device: 'cuda' | 'host', sizes: readonly number[], devices = 1): Promise<Held> {
  const closers: Array<() => void> = [];
  const regions: Held['regions'] = [];
  const close = (): void => {
    for (const c of closers.splice(0).reverse()) c();
  };
  try {
    for (const [i, size] of sizes.entries()) {
      const value = (i * 37 + 1) & 0xff;
      let memory: Memory;
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

/** GB/s of `bytes` in `s` seconds. */
export const gbps = (bytes: number, s: number): number => bytes / s / 1e9;
/** Seconds since the performance.now() reading `t`. */
export const since = (t: number): number => (performance.now() - t) / 1000;

/** A restore form's restores in the sweep: seconds each, their median, against the first count's median and the raw H2D. */
export interface FormTiming {
  restoreSeconds: number[];
  restoreMedianSeconds: number;
  vsFirst: number | null;
  vsCeiling: number | null;
}

export interface SweepRow {
  regions: number;
  bytes: number;
  minRegionBytes: number;
  maxRegionBytes: number;
  setupSeconds: number;
  captureSeconds: number;
  restoreSeconds: number[];
  restoreMedianSeconds: number;
  restoreGBps: number;
  ceiling: Ceiling | null;
  /** restore median / the 36-region (first count's) restore median. */
  vsFirst: number | null;
  /** restore GB/s / this row's raw pinned H2D (best of the ceiling's reps). */
  vsCeiling: number | null;
  /**
   * GPU only: the engine flow's per-region work around the copy. Each allocation exported as a
   * POSIX fd (what the vsnap plugin does in the engine for the export phase), then, as
   * restoreEngine does, one MappedRegions set opened over those fds (import + map), the restore
   * and its GPU digest through it: timed from the first import to the verified copy.
   */
  imported: {
    exportSeconds: number;
    restoreSeconds: number[];
    restoreMedianSeconds: number;
    vsFirst: number | null;
    vsCeiling: number | null;
    /**
     * Per restore, where its time went: MappedRegions.open resolving; the copy (the restore's own
     * `seconds`: its copy queue opened to the last byte landed) and, of it, the first copy issued to
     * the last byte landed (GPU 0's `hydrateSeconds`); the digest it waited for.
     */
    phases: { openSeconds: number[]; copySeconds: number[]; issuedToLandedSeconds: number[]; digestSeconds: number[] };
  } | null;
  /** Why the via-fds restores did not run to the end (e.g. the process's fd limit), if they did not. */
  importedError: string | null;
  /**
   * GPU only: restoreEngine's default form. The memory made in the restore (flows/fill.ts: the
   * largest regions first, their copy started at once, the rest made beside it), every region's
   * allocation exported as a POSIX fd and imported and mapped once region by region beside the copy
   * (what the plugin's adopt does in the engine, stood in for in this process): timed from the first
   * allocation to the verified copy with every region mapped.
   */
  filled: FormTiming | null;
  filledError: string | null;
  /**
   * GPU only: restoreEngine's other form whole (VSNAP_RESTORE_TARGETS=wake), to compare with
   * `filled`: each region's memory made and mapped (what the engine's wake does), exported as a
   * POSIX fd (its export), then imported and mapped as `imported` and copied into: timed from the
   * first allocation to the verified copy.
   */
  woken: FormTiming | null;
  wokenError: string | null;
}

export interface SweepOptions {
  device: 'cuda' | 'host';
  totalBytes: number;
  counts: readonly number[];
  reps: number;
  ceilingBin: string | null;
  store: RegionStore;
  log: Log;
}

/** The region-count sweep: one pinned RAM tier for all counts, each count captured into it, restored `reps` times, evicted. */
export async function runSweep(o: SweepOptions): Promise<{ rows: SweepRow[]; cacheCreateSeconds: number; ceilingNote: string | null }> {
  const granule = o.device === 'cuda' ? 2 * MiB : 4096;
  const layouts = o.counts.map((n) => splitEvenly(o.totalBytes, n, granule));
  const budget = Math.max(...layouts.map((s) => s.reduce((a, b) => a + b, 0))) + 64 * MiB;
  let t = performance.now();
  const cache = await HostCache.create({ budgetBytes: budget, pin: o.device === 'cuda' });
  const cacheCreateSeconds = since(t);
  o.log(`[sweep] RAM tier of ${(budget / GiB).toFixed(2)} GiB (${cache.pinned ? 'pinned' : 'not pinned'}) in ${cacheCreateSeconds.toFixed(2)} s`);
  const rows: SweepRow[] = [];
  const ceilingNote = o.ceilingBin && existsSync(o.ceilingBin) ? null : `no ceiling binary${o.ceilingBin ? ` at ${o.ceilingBin}` : ''} (bench/run.sh builds it with nvcc)`;
  try {
    for (const sizes of layouts) {
      const bytes = sizes.reduce((a, b) => a + b, 0);
      // The ceiling first, in its own process: its buffers are gone before vsnap allocates.
      const ceiling = o.device === 'cuda' ? runCeiling(o.ceilingBin, sizes, o.reps) : null;
      t = performance.now();
      const held = await makeRegions(o.device, sizes);
      const setupSeconds = since(t);
      let snap: Snapshot | undefined;
      try {
        const name = `sweep-${sizes.length}`;
        snap = await Snapshot.capture(o.store, name, { regions: held.regions, cache, persist: 'off' });
        const captureSeconds = snap.lastCapture!.seconds;
        const restoreSeconds: number[] = [];
        for (let r = 0; r < o.reps + 1; r++) {
          const res = await snap.restore({ regions: held.regions, cache });
          if (res.tier !== 'ram') throw new Error(`[sweep] ${sizes.length} regions: restored from ${res.tier ?? 'store'}, expected the RAM tier`);
          if (r > 0) restoreSeconds.push(res.seconds); // the first is a warm-up (first touch of the mappings)
        }
        const m = median(restoreSeconds);
        const first = rows[0]?.restoreMedianSeconds;
        let imported: SweepRow['imported'] = null;
        let importedError: string | null = null;
        if (o.device === 'cuda') {
          const fds: number[] = [];
          try {
            const e0 = performance.now();
            for (const r of held.regions) if (r.memory.kind === 'device') fds.push(r.memory.allocation.exportFd());
            const exportSeconds = since(e0);
            const viaFds = held.regions.map((r, i) => ({ key: r.key, size: r.size, memory: { kind: 'imported' as const, fd: fds[i]!, device: 0 } }));
            const times: number[] = [];
            const phases = { openSeconds: [] as number[], copySeconds: [] as number[], issuedToLandedSeconds: [] as number[], digestSeconds: [] as number[] };
            for (let r = 0; r < o.reps + 1; r++) {
              // As restoreEngine does: one region set in the form it maps an engine's regions
              // (restoreMapping), the hydrate and its GPU digest through it; timed from the first
              // import to the verified copy. The set is closed after the clock (restoreEngine
              // unmaps while the KV cache wakes).
              const t0 = performance.now();
              const set = await MappedRegions.open(viaFds, restoreMapping());
              const opened = since(t0);
              try {
                const res = await snap.restore({ regions: viaFds.map((x, i) => ({ key: x.key, size: x.size, memory: set.memory(i) })), cache });
                if (res.tier !== 'ram') throw new Error(`[sweep] ${sizes.length} imported regions: restored from ${res.tier ?? 'store'}, expected the RAM tier`);
                if (r > 0) {
                  times.push(since(t0));
                  phases.openSeconds.push(opened);
                  phases.copySeconds.push(res.seconds);
                  phases.issuedToLandedSeconds.push(res.devices?.[0]?.hydrateSeconds ?? res.seconds);
                  phases.digestSeconds.push(res.digestSeconds ?? 0);
                }
              } finally {
                await set.close();
              }
            }
            const im = median(times);
            const firstImported = rows[0]?.imported?.restoreMedianSeconds;
            imported = { exportSeconds, restoreSeconds: times, restoreMedianSeconds: im, vsFirst: firstImported ? im / firstImported : 1, vsCeiling: ceiling ? gbps(bytes, im) / ceiling.h2dGBps.max : null, phases };
            const ms = (v: number[]): string => (median(v) * 1e3).toFixed(1);
            o.log(`[sweep] ${sizes.length} regions via fds: ${(im * 1e3).toFixed(1)} ms (open ${ms(phases.openSeconds)}, copy ${ms(phases.copySeconds)} of which first issued to landed ${ms(phases.issuedToLandedSeconds)}, digest waited ${ms(phases.digestSeconds)})`);
          } catch (err) {
            importedError = (err as Error).message.split('\n')[0]!;
            o.log(`[sweep] ${sizes.length} regions via fds failed (the mapped row stands): ${importedError}`);
          } finally {
            for (const fd of fds) closeSync(fd);
          }
        }
        // restoreEngine's two forms, each timed whole (GPU only): `o.reps` restores after one warm-up.
        const timedForm = async (form: 'filled' | 'woken', restore: () => Promise<number>): Promise<{ result: FormTiming | null; error: string | null }> => {
          if (o.device !== 'cuda') return { result: null, error: null };
          try {
            const times: number[] = [];
            for (let r = 0; r < o.reps + 1; r++) {
              const seconds = await restore();
              if (r > 0) times.push(seconds);
            }
            const m = median(times);
            const first = rows[0]?.[form]?.restoreMedianSeconds;
            return { result: { restoreSeconds: times, restoreMedianSeconds: m, vsFirst: first ? m / first : 1, vsCeiling: ceiling ? gbps(bytes, m) / ceiling.h2dGBps.max : null }, error: null };
          } catch (err) {
            const error = (err as Error).message.split('\n')[0]!;
            o.log(`[sweep] ${sizes.length} regions ${form} failed (the mapped row stands): ${error}`);
            return { result: null, error };
          }
        };
        const { result: filled, error: filledError } = await timedForm('filled', () => restoreFilled(snap!, cache));
        const { result: woken, error: wokenError } = await timedForm('woken', () => restoreWoken(snap!, cache));
        const row: SweepRow = {
          regions: sizes.length,
          bytes,
          minRegionBytes: Math.min(...sizes),
          maxRegionBytes: Math.max(...sizes),
          setupSeconds,
          captureSeconds,
          restoreSeconds,
          restoreMedianSeconds: m,
          restoreGBps: gbps(bytes, m),
          ceiling,
          vsFirst: first ? m / first : 1,
          vsCeiling: ceiling ? gbps(bytes, m) / ceiling.h2dGBps.max : null,
          imported,
          importedError,
          filled,
          filledError,
          woken,
          wokenError,
        };
        rows.push(row);
        o.log(
          `[sweep] ${sizes.length} regions of ${(row.minRegionBytes / MiB).toFixed(1)}-${(row.maxRegionBytes / MiB).toFixed(1)} MiB: restore ${(m * 1000).toFixed(1)} ms ` +
            `(${row.restoreGBps.toFixed(2)} GB/s, ${row.vsFirst!.toFixed(3)}x of ${rows[0]!.regions} regions${ceiling ? `, ${row.vsCeiling!.toFixed(3)}x of raw H2D ${ceiling.h2dGBps.max} GB/s` : ''}); ` +
            (imported ? `via fds: export ${(imported.exportSeconds * 1000).toFixed(1)} ms, restore ${(imported.restoreMedianSeconds * 1000).toFixed(1)} ms (${imported.vsFirst!.toFixed(3)}x); ` : '') +
            (filled ? `filled: restore ${(filled.restoreMedianSeconds * 1000).toFixed(1)} ms (${filled.vsFirst!.toFixed(3)}x); ` : '') +
            (woken ? `woken: restore ${(woken.restoreMedianSeconds * 1000).toFixed(1)} ms (${woken.vsFirst!.toFixed(3)}x); ` : '') +
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

/**
 * One restore in restoreEngine's default form (flows/fill-targets.ts), on GPU 0, without an engine:
 * the memory of the largest regions made, their copy started, the rest made beside it (as many at
 * once as the flow makes them), then every allocation's fd imported and mapped region by region
 * (the engine's adopt, stood in for here) while the copy goes on. Returns its seconds; everything
 * is let go after the clock.
 */
async function restoreFilled(snap: Snapshot, cache: HostCache): Promise<number> {
  const wanted = [...snap.manifest.regions()].map(({ rank, region }) => ({ rank, key: region.key, tag: region.tag, size: region.size, tensors: region.tensors.length, device: 0 }));
  const parts: FillMemory[] = [];
  let adopt: MappedRegions | undefined;
  const t0 = performance.now();
  try {
    const firstIds = firstRegions(wanted);
    const isFirst = (w: (typeof wanted)[number]): boolean => firstIds.has(regionId(w.rank, w.key));
    const first = await makeFillMemory(wanted.filter(isFirst));
    parts.push(first);
    let adopted: Promise<void> = Promise.resolve();
    // The rest part by part, each copied as it comes (restoreEngine's fill-targets.ts).
    const more = new Batches<readonly RestoreRegion[]>();
    const rest = (async () => {
      let made: FillMemory[];
      try {
        made = await makeFillMemoryInParts(wanted.filter((w) => !isFirst(w)), (m) => {
          parts.push(m);
          more.send(m.regions);
        });
        more.end();
      } catch (err) {
        more.fail(err);
        throw err;
      }
      const fd = (id: string): number => [first, ...made].map((p) => p.descriptor(id)).find((x) => x !== undefined)!;
      adopted = MappedRegions.open(wanted.map((w) => ({ memory: { kind: 'imported' as const, fd: fd(regionId(w.rank, w.key)), device: 0 }, size: w.size })), { mapping: 'per-region' }).then((set) => void (adopt = set));
      adopted.catch(() => undefined); // awaited after the restore
      return { regions: made.flatMap((p) => p.regions), late: { ids: new Set<string>(), after: adopted } };
    })();
    const res = await snap.restore({ regions: first.regions, cache, stages: { first: firstIds, rest, more } });
    if (res.tier !== 'ram') throw new Error(`[sweep] filled: restored from ${res.tier ?? 'store'}, expected the RAM tier`);
    await adopted;
    return since(t0);
  } finally {
    await adopt?.close();
    for (const p of parts) await p.close();
  }
}

/**
 * One restore in restoreEngine's other form (VSNAP_RESTORE_TARGETS=wake), on GPU 0, without an
 * engine: every region's memory made and mapped one after the other (the engine's wake), each
 * exported as a POSIX fd (its export), then one region set over the fds and the copy with its GPU
 * digest through it, as `imported`. Returns its seconds; everything is let go after the clock.
 */
async function restoreWoken(snap: Snapshot, cache: HostCache): Promise<number> {
  const wanted = [...snap.manifest.regions()].map(({ region }) => ({ key: region.key, size: region.size }));
  const made: DeviceAllocation[] = [];
  const fds: number[] = [];
  let set: MappedRegions | undefined;
  const t0 = performance.now();
  try {
    for (const w of wanted) made.push(await DeviceAllocation.allocate(0, w.size));
    for (const a of made) fds.push(a.exportFd());
    const viaFds = wanted.map((w, i) => ({ key: w.key, size: w.size, memory: { kind: 'imported' as const, fd: fds[i]!, device: 0 } }));
    set = await MappedRegions.open(viaFds, restoreMapping());
    const res = await snap.restore({ regions: viaFds.map((x, i) => ({ key: x.key, size: x.size, memory: set!.memory(i) })), cache });
    if (res.tier !== 'ram') throw new Error(`[sweep] woken: restored from ${res.tier ?? 'store'}, expected the RAM tier`);
    return since(t0);
  } finally {
    await set?.close();
    for (const fd of fds) closeSync(fd);
    for (const a of made) a.close();
  }
}
