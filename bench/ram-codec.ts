// RAM-tier restore of coded BF16 weights (device only), through the public API: regions of BF16
// Gaussian draws (sigma 0.02, whose exponent spread approximates trained weights; synthetic, not
// trained) in device memory, captured into a RamTier with codec 'vsnap-c1', restored from it
// (coded chunks over the link, decoded on the GPU), against the raw pinned H2D copy of the
// UNCOMPRESSED bytes (bench/ceiling.cu, same run), and the same regions through a raw RamTier.
// Also a capture held only in the RAM tier (persist 'off', hash deferred: coded on the GPU before the
// D2H where the cache codes) against the raw pinned D2H copy of the uncompressed bytes. As root, a
// cold restore from the store (page cache dropped, O_DIRECT) of coded blobs (decoded on the GPU) and
// of raw ones, against `dd` O_DIRECT of the uncompressed bytes.
// argv: <ceiling binary> [GiB, default 4] [rounds, default 5] [out.json]. Prints one JSON object.
import { execFileSync, execSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cudaStatus, RamTier, RegionStore, Snapshot } from '../src/index.js';
import { DeviceAllocation, releaseIdleResources } from '../src/plumbing.js';
import { dropCaches, median, MiB, since } from './common.js';
import { gaussianBf16 } from './gaussian-bf16.js';

const [ceilingBin, gibArg = '4', roundsArg = '5', outFile] = process.argv.slice(2);
if (!ceilingBin) throw new Error('usage: bench-ram-codec <ceiling binary> [GiB] [rounds] [out.json]');
const total = Number(gibArg) * 1024 * MiB;
const rounds = Number(roundsArg);
const REGION = 256 * MiB;
const status = await cudaStatus();
if (!status.available) throw new Error(`the RAM-tier codec bench needs a GPU: ${status.reason}`);

// 64 MiB samples of different seeds, repeated: the statistics of the draws, generated fast.
const samples = Array.from({ length: 4 }, (_, i) => gaussianBf16(64 * MiB, 11 + i));
const allocs: DeviceAllocation[] = [];
for (let at = 0, i = 0; at < total; at += REGION, i++) {
  const size = Math.min(REGION, total - at);
  const a = await DeviceAllocation.allocate(0, size);
  allocs.push(a);
  for (let o = 0, k = 0; o < size; o += 64 * MiB, k++) await a.write(o, samples[(i + k) % samples.length]!.subarray(0, Math.min(64 * MiB, size - o)));
}
const regions = allocs.map((a, i) => ({ key: `layer.${i}`, size: a.size, memory: { kind: 'device' as const, allocation: a }, tensors: [{ name: `layer.${i}`, offset: 0, dtype: 'torch.bfloat16', shape: [a.size / 2] }] }));
const rawBytes = regions.reduce((n, r) => n + r.size, 0);
const spread = (v: number[]): { best: number; median: number } => ({ best: Math.min(...v), median: median(v) });
// Restores (or captures) that found no GPU memory for the codec's scratch ran on the CPU: counted, so a figure says which path it timed.
const cpuFallbacks = { restore: 0, capture: 0 };
process.on('warning', (w: Error & { code?: string }) => {
  if (w.code === 'VSNAP_CODEC') cpuFallbacks.restore++;
  if (w.code === 'VSNAP_RAM_TIER' && w.message.includes("no GPU memory for the codec's scratch")) cpuFallbacks.capture++;
});

async function measure(codec: 'vsnap-c1' | 'off') {
  const root = mkdtempSync(join(tmpdir(), 'vsnap-bench-ram-codec-'));
  const store = await RegionStore.open(root);
  const cache = await RamTier.create({ budgetBytes: rawBytes + 64 * MiB, codec });
  try {
    const t0 = performance.now();
    const snap = await Snapshot.capture(store, 'bench', { regions, ram: cache });
    const captureSeconds = since(t0);
    const plain: number[] = [];
    const checked: number[] = [];
    for (let r = 0; r < rounds; r++) {
      plain.push((await snap.restore({ regions, ram: cache, verifyDigests: false })).seconds);
      const t1 = performance.now();
      await snap.restore({ regions, ram: cache });
      checked.push(since(t1));
    }
    const heldBytes = cache.usedBytes;
    const ramOnly: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const t2 = performance.now();
      const once = await Snapshot.capture(store, 'bench-ram-only', { regions, ram: cache, persist: 'off' });
      ramOnly.push(since(t2));
      cache.evict(once.id);
    }
    return { codec, heldBytes, captureSeconds, ramOnlyCapture: spread(ramOnly), restore: spread(plain), restoreChecked: spread(checked) };
  } finally {
    cache.close();
    rmSync(root, { recursive: true, force: true });
  }
}

// Cold restores from the store, each after the page cache is dropped; null where it cannot be dropped.
async function coldStore(): Promise<{ rawSeconds: number[]; codedSeconds: number[]; ddGBps: number; storedRatio: number } | { skipped: string }> {
  const why = dropCaches();
  if (why !== null) return { skipped: why };
  const root = mkdtempSync(join(tmpdir(), 'vsnap-bench-cold-'));
  try {
    const store = await RegionStore.open(root);
    const snaps = { raw: await Snapshot.capture(store, 'raw', { regions }), coded: await Snapshot.capture(store, 'coded', { regions, codec: 'vsnap-c1' }) };
    const seconds = { raw: [] as number[], coded: [] as number[] };
    for (let r = 0; r < rounds; r++) {
      for (const form of ['raw', 'coded'] as const) {
        dropCaches();
        const t = performance.now();
        await snaps[form].restore({ regions, directIo: true });
        seconds[form].push(since(t));
      }
    }
    dropCaches();
    const blob = store.blobPath(snaps.raw.manifest.data.ranks[0]!.regions[0]!.blob);
    const dd = /copied, ([\d.]+) s/.exec(execSync(`dd if=${blob} of=/dev/null bs=64M iflag=direct 2>&1`, { encoding: 'utf8' }));
    if (!dd) throw new Error('dd printed no time');
    return { rawSeconds: seconds.raw, codedSeconds: seconds.coded, ddGBps: REGION / Number(dd[1]) / 1e9, storedRatio: +(snaps.coded.manifest.storedBytes / rawBytes).toFixed(3) };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

const coded = await measure('vsnap-c1');
const raw = await measure('off');
const cold = await coldStore().catch((err: unknown) => ({ skipped: `failed: ${(err as Error).message}` })); // the figures above are kept
const ceiling = JSON.parse(execFileSync(ceilingBin, [String(rounds), ...regions.map((r) => String(r.size))], { encoding: 'utf8' })) as {
  h2dGBps: { max: number; median: number };
  d2hGBps: { max: number; median: number };
};
const ceilingSeconds = rawBytes / (ceiling.h2dGBps.max * 1e9);
const d2hSeconds = rawBytes / (ceiling.d2hGBps.max * 1e9);
const ratio = (s: number): number => +(s / ceilingSeconds).toFixed(3);
const captureRatio = (s: number): number => +(s / d2hSeconds).toFixed(3);
const result = {
  device: status,
  rawBytes,
  data: 'BF16 Gaussian draws (sigma 0.02), synthetic',
  ceiling: { h2dGBps: ceiling.h2dGBps, seconds: ceilingSeconds, d2hGBps: ceiling.d2hGBps, d2hSeconds },
  coded: {
    ...coded,
    heldRatio: +(coded.heldBytes / rawBytes).toFixed(3),
    ratio: ratio(coded.restore.best),
    ratioChecked: ratio(coded.restoreChecked.best),
    ramOnlyCaptureRatio: captureRatio(coded.ramOnlyCapture.best),
  },
  raw: { ...raw, ratio: ratio(raw.restore.best), ratioChecked: ratio(raw.restoreChecked.best), ramOnlyCaptureRatio: captureRatio(raw.ramOnlyCapture.best) },
  // the coded cold restore against dd O_DIRECT of the uncompressed bytes (target 0.75x), the raw one beside it
  coldStore:
    'skipped' in cold
      ? cold
      : { ...cold, ddSeconds: rawBytes / (cold.ddGBps * 1e9), ratio: +(Math.min(...cold.codedSeconds) / (rawBytes / (cold.ddGBps * 1e9))).toFixed(3), rawRatio: +(Math.min(...cold.rawSeconds) / (rawBytes / (cold.ddGBps * 1e9))).toFixed(3) },
  targets: { ratio: 0.75, ratioChecked: 0.8, heldRatio: 0.72, ramOnlyCaptureRatio: 0.85, coldStoreRatio: 0.75 },
  cpuFallbacks, // 0 and 0: every coded restore and capture above ran on the GPU
};
console.log(JSON.stringify(result, null, 2));
if (outFile) writeFileSync(outFile, JSON.stringify(result, null, 2) + '\n');
for (const a of allocs) a.close();
await releaseIdleResources();
