// The `capture2` row of `npm run bench -- swap` (issue 14): capture into the RAM tier with the
// regions on two GPUs at once, against both GPUs' aggregate raw D2H measured in the same run
// (bench/ceiling.cu), in both capture modes:
//   hashed    hash 'now': XXH3 per chunk on the capture workers as each chunk lands
//   deferred  hash 'deferred' (the default into the RAM tier only): the bulk DMA alone, with the
//             GPU digest of the source taken before it; XXH3 when the capture is persisted,
//             which is timed too (off the capture's path)
// plus the profile of the suspect for the hashed mode: the same raw D2H while XXH3 hashing
// threads (vsnap's own checksum, one per capture worker) stream host memory. With --device host
// the same captures run on memfd regions (a dry run: no ceiling, timings mean nothing there).
import { Worker } from 'node:worker_threads';

import { HostCache, type RegionMemory, type RegionStore, Snapshot } from '../src/index.js';
import { median } from './swap-report.js';
import { type Ceiling, gbps, type Log, makeRegions, runCeiling, since } from './swap-sweep.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

export interface HashLoad {
  threads: number;
  /** Per thread: [start ms, end ms, bytes] of every XXH3 pass, on the process's common clock (performance.timeOrigin + now). */
  passes: Array<Array<[number, number, number]>>;
  /** Aggregate XXH3 GB/s over the window. */
  GBps: number;
  windowSeconds: number;
}

/**
 * XXH3 (vsnap's own checksum) on `threads` worker threads, each over its own 256 MiB buffer (well
 * beyond the caches: every pass reads DRAM, as the capture's hashing of just-landed chunks does),
 * while `during` runs; returns per-pass timestamps.
 */
export async function withHashLoad<T>(nativePath: string, threads: number, during: () => T | Promise<T>, bufferBytes = 256 * MiB): Promise<{ value: T; load: HashLoad }> {
  const code = `const { parentPort, workerData } = require('node:worker_threads');
const n = require(workerData.path);
const buf = new Uint8Array(workerData.bytes).fill(7);
const now = () => performance.timeOrigin + performance.now();
const passes = [];
let stop = false;
parentPort.on('message', () => { stop = true; });
parentPort.postMessage('ready');
(function loop() {
  if (stop) { parentPort.postMessage(passes); return; }
  const t0 = now(); n.checksum(buf); passes.push([t0, now(), buf.length]);
  setImmediate(loop);
})();`;
  const workers = Array.from({ length: threads }, () => new Worker(code, { eval: true, workerData: { path: nativePath, bytes: bufferBytes } }));
  try {
    await Promise.all(workers.map((w) => new Promise((resolve, reject) => (w.once('message', resolve), w.once('error', reject)))));
    const t0 = performance.now();
    const value = await during();
    const windowSeconds = since(t0);
    const passes = await Promise.all(
      workers.map((w) => new Promise<Array<[number, number, number]>>((resolve, reject) => (w.once('message', resolve), w.once('error', reject), w.postMessage('stop')))),
    );
    const start = performance.timeOrigin + t0;
    const end = start + windowSeconds * 1000;
    const inWindow = passes.flat().filter(([a, b]) => a >= start && b <= end);
    const bytes = inWindow.reduce((n, [, , b]) => n + b, 0);
    return { value, load: { threads, passes, GBps: gbps(bytes, windowSeconds), windowSeconds } };
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

/** One capture mode's figures: best of the reps (transfer seconds, as TransferSummary.seconds). */
export interface Capture2Mode {
  hash: 'now' | 'deferred';
  captureSeconds: number[];
  GBps: number;
  vsD2h: number | null;
  /** Median seconds of the GPU digest of the source taken before each copy (in both modes). */
  digestSeconds: number;
  /** GB/s with the digest counted in: bytes / (best transfer + median digest). */
  withDigestGBps: number;
  /** Per worker-thread count: best seconds of 2 (cuda only). */
  byThreads: Array<{ threads: number; seconds: number; GBps: number }>;
  /** The capture's progress trace of the first rep: [ms since start, bytes done]. */
  progress: Array<[number, number]>;
}

export interface Capture2Result {
  skipped: string | null;
  device?: 'cuda' | 'host';
  bytes?: number;
  regions?: number;
  ceiling?: Ceiling | null;
  ceilingUnderHashing?: Ceiling | null;
  hashLoad?: HashLoad | null;
  /** The same hashing threads with no DMA running (1 s): their aggregate XXH3 GB/s alone. */
  hashAlone?: HashLoad | null;
  hashed?: Capture2Mode;
  deferred?: Capture2Mode;
  /** Persisting one deferred capture (XXH3 + the digest check of the RAM copy + blob writes): seconds, off the capture's path. */
  deferredPersistSeconds?: number | null;
  oneGpuCeiling?: Ceiling | null;
  /** One GPU's half, per mode (best of the reps). */
  oneGpu?: { hashedGBps: number; deferredGBps: number };
  // The hashed mode's figures under the names of the first release (the JSON's readers):
  captureSeconds?: number[];
  captureGBps?: number;
  vsD2h?: number | null;
  captureByThreads?: Array<{ threads: number; seconds: number; GBps: number }>;
  oneGpuCaptureGBps?: number;
  progress?: Array<[number, number]>;
  captureMode?: string;
}

export interface Capture2Options {
  device?: 'cuda' | 'host';
  gpus: number;
  totalBytes: number;
  reps: number;
  ceilingBin: string | null;
  hashThreads: number;
  nativePath: string;
  store: RegionStore;
  log: Log;
}

type Regions = Array<{ key: string; size: number; memory: RegionMemory }>;

/** `reps` captures of `regions` into the RAM tier in one mode (each evicted after), best and median digest. */
async function captureMode(o: Capture2Options, cache: HostCache, regions: Regions, hash: 'now' | 'deferred', ceiling: Ceiling | null, withThreads: boolean): Promise<Capture2Mode> {
  const bytes = regions.reduce((n, r) => n + r.size, 0);
  const captureSeconds: number[] = [];
  const digests: number[] = [];
  let progress: Array<[number, number]> = [];
  for (let r = 0; r < o.reps; r++) {
    const trace: Array<[number, number]> = [];
    const t0 = performance.now();
    const snap = await Snapshot.capture(o.store, 'capture2', {
      regions,
      cache,
      persist: 'off',
      hash,
      onProgress: (p) => trace.push([Math.round((performance.now() - t0) * 10) / 10, p.bytesDone]),
    });
    if (snap.lastCapture!.hash !== hash) throw new Error(`[capture2] asked for hash '${hash}', the capture hashed '${snap.lastCapture!.hash}' (no GPU digests?)`);
    captureSeconds.push(snap.lastCapture!.seconds);
    digests.push(snap.lastCapture!.digestSeconds ?? 0);
    if (r === 0) progress = trace;
    cache.evict(snap.id);
  }
  // How the capture scales with its worker threads (hashed: each hashes the chunks it copied).
  const byThreads: Capture2Mode['byThreads'] = [];
  for (const threads of withThreads ? [2, 4, 8, 16] : []) {
    const runs: number[] = [];
    for (let r = 0; r < 2; r++) {
      const snap = await Snapshot.capture(o.store, 'capture2', { regions, cache, persist: 'off', hash, threads });
      runs.push(snap.lastCapture!.seconds);
      cache.evict(snap.id);
    }
    byThreads.push({ threads, seconds: Math.min(...runs), GBps: gbps(bytes, Math.min(...runs)) });
  }
  const best = Math.min(...captureSeconds);
  const digestSeconds = median(digests);
  const GBps = gbps(bytes, best);
  return { hash, captureSeconds, GBps, vsD2h: ceiling ? GBps / ceiling.d2hGBps.max : null, digestSeconds, withDigestGBps: gbps(bytes, best + digestSeconds), byThreads, progress };
}

/** Capture into the RAM tier with half the regions on each of two GPUs, both modes, beside the aggregate D2H and the D2H under hashing load. */
export async function runCapture2(o: Capture2Options): Promise<Capture2Result> {
  const device = o.device ?? 'cuda';
  if (device === 'cuda' && o.gpus < 2) return { skipped: `needs 2 GPUs, ${o.gpus} visible (run on nvidia-h200-x2)` };
  // The layout of bench/transfer.ts: embeddings and head of 1 GiB, norms of 2 MiB, layers of 448 MiB; region i on GPU i % 2.
  const layer = Math.min(448 * MiB, Math.max(4 * MiB, Math.floor(o.totalBytes / 8 / (2 * MiB)) * 2 * MiB));
  const head = layer === 448 * MiB ? GiB : 2 * layer;
  const sizes = [head, head, 2 * MiB, 2 * MiB];
  for (let left = o.totalBytes - sizes.reduce((a, b) => a + b, 0); left >= layer; left -= layer) sizes.push(layer);
  const bytes = sizes.reduce((a, b) => a + b, 0);
  const cuda = device === 'cuda';
  const ceiling = cuda ? runCeiling(o.ceilingBin, sizes, o.reps, 2) : null;
  const oneGpuSizes = sizes.filter((_, i) => i % 2 === 0);
  const oneGpuCeiling = cuda ? runCeiling(o.ceilingBin, oneGpuSizes, o.reps, 1) : null;
  let ceilingUnderHashing: Ceiling | null = null;
  let hashLoad: HashLoad | null = null;
  let hashAlone: HashLoad | null = null;
  if (ceiling) {
    const loaded = await withHashLoad(o.nativePath, o.hashThreads, () => runCeiling(o.ceilingBin, sizes, o.reps, 2));
    ceilingUnderHashing = loaded.value;
    hashLoad = loaded.load;
    hashAlone = (await withHashLoad(o.nativePath, o.hashThreads, () => new Promise((r) => setTimeout(r, 1000)))).load;
    o.log(`[capture2] raw D2H, 2 GPUs: ${ceiling.d2hGBps.max} GB/s alone, ${ceilingUnderHashing?.d2hGBps.max} GB/s while ${o.hashThreads} threads hash at ${hashLoad.GBps.toFixed(1)} GB/s (${hashAlone.GBps.toFixed(1)} GB/s with no DMA)`);
  }
  const cache = await HostCache.create({ budgetBytes: bytes + 64 * MiB, pin: cuda });
  const held = await makeRegions(device, sizes, 2);
  try {
    const hashed = await captureMode(o, cache, held.regions, 'now', ceiling, cuda);
    const deferred = await captureMode(o, cache, held.regions, 'deferred', ceiling, cuda);
    const show = (m: Capture2Mode): string =>
      `${m.GBps.toFixed(2)} GB/s (${m.vsD2h === null ? 'no D2H ceiling' : `${m.vsD2h.toFixed(3)}x of aggregate D2H`}; ${m.withDigestGBps.toFixed(2)} GB/s with the GPU digest of ${(m.digestSeconds * 1000).toFixed(1)} ms)` +
      (m.byThreads.length ? `; by worker threads: ${m.byThreads.map((c) => `${c.threads}: ${c.GBps.toFixed(1)}`).join(', ')}` : '');
    o.log(`[capture2] capture into the RAM tier, ${cuda ? '2 GPUs' : 'host memory'}, hashed: ${show(hashed)}`);
    o.log(`[capture2] capture into the RAM tier, ${cuda ? '2 GPUs' : 'host memory'}, deferred hash: ${show(deferred)}`);
    // The deferred capture's XXH3, paid when it is persisted (store writes included), then removed.
    let deferredPersistSeconds: number | null = null;
    const snap = await Snapshot.capture(o.store, 'capture2', { regions: held.regions, cache, persist: 'off', hash: 'deferred' });
    try {
      const t = performance.now();
      await snap.persist();
      deferredPersistSeconds = since(t);
      o.log(`[capture2] persisting the deferred capture (XXH3, digest check of the RAM copy, blob writes): ${deferredPersistSeconds.toFixed(2)} s (${gbps(bytes, deferredPersistSeconds).toFixed(2)} GB/s)`);
    } finally {
      cache.evict(snap.id);
      await o.store.remove('capture2');
      await o.store.gc();
    }
    const oneGpu = held.regions.filter((_, i) => i % 2 === 0);
    const oneGbps = async (hash: 'now' | 'deferred'): Promise<number> => {
      const one = await Snapshot.capture(o.store, 'capture1', { regions: oneGpu, cache, persist: 'off', hash });
      cache.evict(one.id);
      return gbps(one.lastCapture!.bytes, one.lastCapture!.seconds);
    };
    const one = { hashedGBps: await oneGbps('now'), deferredGBps: await oneGbps('deferred') };
    return {
      skipped: null,
      device,
      bytes,
      regions: sizes.length,
      ceiling,
      oneGpuCeiling,
      ceilingUnderHashing,
      hashLoad,
      hashAlone,
      hashed,
      deferred,
      deferredPersistSeconds,
      oneGpu: one,
      captureSeconds: hashed.captureSeconds,
      captureGBps: hashed.GBps,
      vsD2h: hashed.vsD2h,
      captureByThreads: hashed.byThreads,
      oneGpuCaptureGBps: one.hashedGBps,
      progress: hashed.progress,
      captureMode: "hashed = hash 'now' (XXH3 per chunk on the capture workers); deferred = hash 'deferred' (the default into the RAM tier only: DMA alone, XXH3 on persist)",
    };
  } finally {
    held.close();
    cache.close();
  }
}

const f = (x: number | null | undefined, digits = 3): string => (x === null || x === undefined || !Number.isFinite(x) ? 'n/a' : x.toFixed(digits));
const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

/** The markdown table of the row. */
export function capture2Table(c: Capture2Result | null): string {
  if (!c) return '';
  if (c.skipped) return `| two-GPU capture into the RAM tier | skipped: ${cell(c.skipped)} |\n|---|---|`;
  const d2h = c.ceiling?.d2hGBps.max;
  const vs = (g: number | undefined): string => (d2h ? `${f((g ?? 0) / d2h)}x` : 'n/a');
  const where = c.device === 'host' ? 'host memory (dry run: no D2H)' : 'both GPUs at once';
  const mode = (m: Capture2Mode | undefined, label: string): string[] =>
    m
      ? [
          `| vsnap capture into the RAM tier, ${where} (${label}), best of ${m.captureSeconds.length} | ${f(m.GBps, 2)} | ${vs(m.GBps)} |`,
          `| the same, with the GPU digest of the source before the copy (${f(m.digestSeconds * 1000, 1)} ms) | ${f(m.withDigestGBps, 2)} | ${vs(m.withDigestGBps)} |`,
          ...m.byThreads.map((t) => `| vsnap capture into the RAM tier, both GPUs (${label}), ${t.threads} worker threads, best of 2 | ${f(t.GBps, 2)} | ${vs(t.GBps)} |`),
        ]
      : [];
  const persist = c.deferredPersistSeconds ?? null;
  const lines = [
    `| two-GPU capture, ${f((c.bytes ?? 0) / GiB, 2)} GiB in ${c.regions} regions (half on each GPU) | GB/s | vs aggregate D2H |`,
    '|---|---:|---:|',
    `| raw pinned D2H, both GPUs at once (ceiling) | ${f(d2h, 2)} | 1.00x |`,
    `| raw pinned D2H, both GPUs, while ${c.hashLoad?.threads ?? 'n/a'} threads run XXH3 over DRAM (${f(c.hashLoad?.GBps, 1)} GB/s hashed) | ${f(c.ceilingUnderHashing?.d2hGBps.max, 2)} | ${vs(c.ceilingUnderHashing?.d2hGBps.max)} |`,
    ...mode(c.hashed, 'hashed'),
    ...mode(c.deferred, 'deferred hash'),
    `| persisting the deferred capture: XXH3 + digest check of the RAM copy + blob writes (off the capture's path) | ${persist === null ? 'n/a' : f((c.bytes ?? 0) / persist / 1e9, 2)} | |`,
    `| XXH3 on ${c.hashAlone?.threads ?? 'n/a'} threads, no DMA running (GB/s hashed) | ${f(c.hashAlone?.GBps, 1)} | |`,
    `| raw pinned D2H, one GPU (its half) | ${f(c.oneGpuCeiling?.d2hGBps.max, 2)} | |`,
    `| vsnap capture into the RAM tier, one GPU (its half), hashed / deferred hash | ${f(c.oneGpu?.hashedGBps, 2)} / ${f(c.oneGpu?.deferredGBps, 2)} | ${c.oneGpuCeiling ? `${f((c.oneGpu?.hashedGBps ?? 0) / c.oneGpuCeiling.d2hGBps.max)}x / ${f((c.oneGpu?.deferredGBps ?? 0) / c.oneGpuCeiling.d2hGBps.max)}x one-GPU D2H` : ''} |`,
    '',
    `Target (issue 14): >= 0.9x of the aggregate D2H, judged on the default mode into the RAM tier only (deferred hash). Modes: ${c.captureMode}. ` +
      'Both modes take the GPU digest of the source before the copy (the engine is paused); the deferred capture is checked against it after every restore from RAM and when persisted. ' +
      'The second row tests the suspect of the hashed mode (host memory traffic from hashing while the DMA writes) without vsnap; per-pass timestamps of every hashing thread and the captures\' progress traces (~100 ms) are in the JSON.',
  ];
  return lines.join('\n');
}

/** The target line of the row: the default (deferred) mode against the aggregate D2H, the hashed one beside it. */
export function capture2Target(c: Capture2Result): { value: string; met: boolean | null } {
  if (c.skipped) return { value: `skipped: ${cell(c.skipped)}`, met: null };
  const d = c.deferred;
  const h = c.hashed;
  const vs = d?.vsD2h ?? null;
  return {
    value: `${f(d?.GBps, 2)} / ${f(c.ceiling?.d2hGBps.max, 2)} GB/s = ${vs === null ? 'n/a' : `${f(vs)}x`} deferred hash (hashed: ${h?.vsD2h == null ? 'n/a' : `${f(h.vsD2h)}x`})`,
    met: vs === null ? null : vs >= 0.9,
  };
}
