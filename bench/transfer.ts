// vsnap transfer benchmark (device only; `npm run bench`). Moves the same bytes, in regions of
// realistic sizes, every way the public API can, and measures the ceiling in the same run:
//   ceiling   raw cudaMemcpy H2D / D2H from pinned memory (bench/ceiling.cu), and dd O_DIRECT
//   vsnap     capture GPU -> RAM tier (hashed, persist off) and its later persist to disk;
//             capture GPU -> store; restore from the RAM tier, the page cache (warm) and cold
//             disk (caches dropped; buffered and O_DIRECT); verify (re-hash) from the page cache
//   peers     bench/peers.py on the same bytes (safetensors, torch copy_, the CUDA checkpoint
//             API, reloading the reference engine); one GPU only, VSNAP_BENCH_PEERS=0 skips it
// argv: <GiB> <out-dir> <store-dir> <ceiling binary> [devices]; with N devices, region i lives
// on GPU i % N and every row (the ceiling too) moves all devices' regions at once.
// Writes <out>/bench-<gib>GiB[-<N>gpu].json and .md, and prints the markdown table.
import { execFileSync, execSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';

import { cudaStatus, RamTier, RegionStore, Snapshot } from '../src/index.js';
import { listDevices, releaseIdleResources } from '../src/plumbing.js';
import { dropCaches, gbps, GiB, median, MiB, since } from './common.js';
import { packageRoot } from './engine.js';
import type { Ceiling } from './swap-report.js';
import { makeRegions } from './swap-sweep.js';

const [totalGiBArg, outDir = '.', storeRoot = '/tmp/vsnap-bench-store', ceilingBin = 'bench/ceiling', devicesArg = '1'] = process.argv.slice(2);
const totalGiB = Number(totalGiBArg ?? 16);
const deviceCount = Number(devicesArg);
const REPS = 3;

/** A decoder-only model's weights: embeddings and head of 1 GiB each, layers of 448 MiB, norms of 2 MiB. */
function regionSizes(total: number): number[] {
  const sizes = [GiB, GiB, 2 * MiB, 2 * MiB];
  let left = total - sizes.reduce((a, b) => a + b, 0);
  while (left >= 448 * MiB) {
    sizes.push(448 * MiB);
    left -= 448 * MiB;
  }
  if (left >= 2 * MiB) sizes.push(Math.floor(left / (2 * MiB)) * 2 * MiB);
  return sizes;
}

const best = (v: number[]): { max: number; median: number } => ({ max: Math.max(...v), median: median(v) });

const status = await cudaStatus();
if (!status.available) throw new Error(`the benchmark needs a GPU: ${status.reason}`);
const gpus = await listDevices();
const device = gpus[0];
if (!Number.isInteger(deviceCount) || deviceCount < 1 || deviceCount > gpus.length) throw new Error(`devices must be 1..${gpus.length}, not ${devicesArg}`);
const sizes = regionSizes(totalGiB * GiB);
const bytes = sizes.reduce((a, b) => a + b, 0);
const where = deviceCount > 1 ? `${deviceCount}x ${device!.name}` : device!.name;
console.error(`bench: ${sizes.length} regions, ${(bytes / GiB).toFixed(2)} GiB on ${where}`);

const ceilingArgs = [String(REPS), ...(deviceCount > 1 ? ['--devices', String(deviceCount)] : []), ...sizes.map(String)];
const ceiling = JSON.parse(execFileSync(ceilingBin, ceilingArgs, { encoding: 'utf8' })) as Ceiling;
console.error(`ceiling: H2D ${ceiling.h2dGBps.max} GB/s, D2H ${ceiling.d2hGBps.max} GB/s`);

const held = await makeRegions('cuda', sizes, deviceCount);
const regions = held.regions;

rmSync(storeRoot, { recursive: true, force: true });
mkdirSync(storeRoot, { recursive: true });
const store = await RegionStore.open(storeRoot);
// Capture into the RAM tier (persist off): the GPU could be freed as soon as this returns. First,
// so its persisted copy is gone (removed, gc'd) before the capture to disk: the disk holds one.
const c0 = performance.now();
const cache = await RamTier.create({ budgetBytes: bytes + 64 * MiB });
const cacheCreateSeconds = since(c0);
const toRam: number[] = [];
let inRam: Snapshot | undefined;
for (let r = 0; r < REPS; r++) {
  if (inRam) cache.evict(inRam.id);
  inRam = await Snapshot.capture(store, 'bench-ram', { regions, ram: cache, persist: 'off' });
  toRam.push(gbps(bytes, inRam.lastCapture!.seconds));
}
const p0 = performance.now();
await inRam!.persist();
const persistSeconds = since(p0);
cache.clear();
console.error(`capture to RAM tier: ${toRam.map((x) => x.toFixed(2)).join(', ')} GB/s; persisted to disk in ${persistSeconds.toFixed(2)} s`);
await store.remove('bench-ram');
await store.gc();

const t0 = performance.now();
const snap = await Snapshot.capture(store, 'bench', { regions });
const captureWall = since(t0);
const capture = snap.lastCapture!;
console.error(`capture: ${gbps(bytes, capture.seconds).toFixed(2)} GB/s (transfer incl. fsync), ${captureWall.toFixed(2)} s with publish`);

const warm: number[] = [];
for (let r = 0; r < REPS; r++) warm.push(gbps(bytes, (await snap.restore({ regions })).seconds));
console.error(`hydrate warm: ${warm.map((x) => x.toFixed(2)).join(', ')} GB/s`);

// RAM tier: pinned once (above), loaded (and verified) once from the page cache, then bulk DMA.
const l0 = performance.now();
await cache.load(store, snap.manifest);
const cacheLoadGBps = gbps(bytes, since(l0));
const ram: number[] = [];
for (let r = 0; r < REPS; r++) {
  const res = await snap.restore({ regions, ram: cache });
  if (res.tier !== 'ram') throw new Error('expected a restore from the RAM tier');
  ram.push(gbps(bytes, res.seconds));
}
cache.close();
console.error(`hydrate RAM tier: ${ram.map((x) => x.toFixed(2)).join(', ')} GB/s (loaded at ${cacheLoadGBps.toFixed(2)} GB/s)`);

const verifyRuns: number[] = [];
for (let r = 0; r < 2; r++) {
  const report = await store.verify('bench');
  verifyRuns.push(gbps(report.bytes, report.seconds));
}

let coldDirect: number | null = null;
let coldBuffered: number | null = null;
let ddDirect: number | null = null;
if (dropCaches() === null) {
  coldDirect = gbps(bytes, (await snap.restore({ regions, directIo: true })).seconds);
  dropCaches();
  coldBuffered = gbps(bytes, (await snap.restore({ regions })).seconds);
  dropCaches();
  const big = [...snap.manifest.regions()].find((r) => r.region.size === GiB)!.region;
  const out = execSync(`dd if=${store.blobPath(big.blob)} of=/dev/null bs=64M iflag=direct 2>&1`, { encoding: 'utf8' });
  const m = /copied, ([\d.]+) s/.exec(out);
  if (m) ddDirect = gbps(GiB, Number(m[1]));
}
console.error(`hydrate cold: O_DIRECT ${coldDirect?.toFixed(2)} GB/s, buffered ${coldBuffered?.toFixed(2)} GB/s; dd O_DIRECT ${ddDirect?.toFixed(2)} GB/s`);

held.close();
await releaseIdleResources();
rmSync(storeRoot, { recursive: true, force: true });

// The peers, on the same bytes, after vsnap has given back its GPU and pinned memory.
let peers: { json: unknown; table: string } | null = null;
const peersScript = join(packageRoot(), 'bench', 'peers.py');
if (deviceCount === 1 && process.env.VSNAP_BENCH_PEERS !== '0' && existsSync(peersScript)) {
  const peersOut = join(outDir, `peers-${totalGiB}GiB.json`);
  mkdirSync(outDir, { recursive: true });
  const run = spawnSync('python3', [peersScript, '--gib', String(totalGiB), '--out', peersOut], {
    stdio: ['ignore', 'ignore', 'inherit'],
    timeout: Number(process.env.VSNAP_BENCH_PEERS_TIMEOUT_S ?? 420) * 1000,
  });
  if (run.status === 0 && existsSync(peersOut)) {
    peers = { json: JSON.parse(readFileSync(peersOut, 'utf8')), table: readFileSync(peersOut.replace(/\.json$/, '.md'), 'utf8') };
  } else {
    console.error(`peers: bench/peers.py failed (status ${run.status}); the table has vsnap's rows only`);
  }
}

const result = {
  date: new Date().toISOString(),
  machine: { gpu: device!.name, driverCuda: status.driverVersion, cpu: cpus()[0]?.model, cores: cpus().length, node: process.versions.node },
  bytes,
  regions: sizes.length,
  devices: deviceCount,
  reps: REPS,
  ceiling: { h2dGBps: ceiling.h2dGBps.max, d2hGBps: ceiling.d2hGBps.max, pinSecondsPerGiB: ceiling.pinSeconds / (bytes / GiB), ddDirectGBps: ddDirect },
  vsnap: {
    captureToRamTierGBps: best(toRam),
    persistFromRamTierSeconds: persistSeconds,
    captureGBps: gbps(bytes, capture.seconds),
    captureWallSeconds: captureWall,
    hydrateWarmGBps: best(warm),
    hydrateRamTierGBps: best(ram),
    ramTierCreateSeconds: cacheCreateSeconds,
    ramTierLoadGBps: cacheLoadGBps,
    verifyWarmGBps: Math.max(...verifyRuns),
    hydrateColdDirectGBps: coldDirect,
    hydrateColdBufferedGBps: coldBuffered,
  },
};
const ratio = (x: number | null, c: number | null): string => (x && c ? `${(x / c).toFixed(2)}x` : 'n/a');
const f = (x: number | null): string => (x === null ? 'n/a' : x.toFixed(2));
const table = [
  `| ${(bytes / GiB).toFixed(1)} GiB, ${sizes.length} regions, ${where} | GB/s | vs ceiling |`,
  '|---|---:|---:|',
  `| ceiling: raw cudaMemcpy H2D, pinned | ${f(ceiling.h2dGBps.max)} | 1.00x |`,
  `| ceiling: raw cudaMemcpy D2H, pinned | ${f(ceiling.d2hGBps.max)} | 1.00x |`,
  `| ceiling: dd O_DIRECT read of a blob | ${f(ddDirect)} | 1.00x |`,
  `| vsnap hydrate, RAM tier (pinned RamTier), best of ${REPS} | ${f(result.vsnap.hydrateRamTierGBps.max)} | ${ratio(result.vsnap.hydrateRamTierGBps.max, ceiling.h2dGBps.max)} H2D |`,
  `| vsnap hydrate, page cache (warm), best of ${REPS} | ${f(result.vsnap.hydrateWarmGBps.max)} | ${ratio(result.vsnap.hydrateWarmGBps.max, ceiling.h2dGBps.max)} H2D |`,
  `| vsnap RAM tier load from page cache (verify into pinned RAM) | ${f(cacheLoadGBps)} | |`,
  `| vsnap hydrate, cold, O_DIRECT | ${f(coldDirect)} | ${ratio(coldDirect, ddDirect)} dd |`,
  `| vsnap hydrate, cold, buffered | ${f(coldBuffered)} | ${ratio(coldBuffered, ddDirect)} dd |`,
  `| vsnap capture to RAM tier (pinned, hashed), best of ${REPS} | ${f(result.vsnap.captureToRamTierGBps.max)} | ${ratio(result.vsnap.captureToRamTierGBps.max, ceiling.d2hGBps.max)} D2H |`,
  `| vsnap persist of that capture, RAM tier -> disk (incl. fdatasync) | ${f(gbps(bytes, persistSeconds))} | |`,
  `| vsnap capture to disk (incl. fdatasync) | ${f(result.vsnap.captureGBps)} | ${ratio(result.vsnap.captureGBps, ceiling.d2hGBps.max)} D2H |`,
  `| vsnap verify (re-hash), page cache | ${f(result.vsnap.verifyWarmGBps)} | |`,
].join('\n');
const suffix = deviceCount > 1 ? `-${deviceCount}gpu` : '';
const full = peers ? `${table}\n\n${peers.table}` : table;
mkdirSync(outDir, { recursive: true });
writeFileSync(join(outDir, `bench-${totalGiB}GiB${suffix}.json`), `${JSON.stringify({ ...result, peers: peers?.json ?? null }, null, 2)}\n`);
writeFileSync(join(outDir, `bench-${totalGiB}GiB${suffix}.md`), `${full}\n`);
console.log(full);
