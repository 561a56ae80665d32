// Persisting a capture whose hash was deferred (issue 14, "no work twice"): its RAM-tier copy is
// hashed (XXH3) into blobs and checked against the GPU digests taken at capture. CPU only.
//   fused:     one native pass, each chunk read once (piece by piece) for both (digest: true);
//   two-pass:  the hashing capture pass, then a separate digest pass over the same RAM copy
//              (how persistFromRamTier worked before the fused pass);
//   hash only: the hashing capture pass alone, the ceiling of this work on this machine.
// Every pass writes its blobs to a fresh directory (VSNAP_BENCH_DIR, default the OS temp
// folder; a tmpfs such as /dev/shm takes the disk out of the figures), removed after each rep. The
// passes alternate within each rep, so a noisy neighbour hits all of them alike.
// Usage:  npx tsx bench/persist.ts [MiB] [regions] [repeats]   (defaults 2048 8 5)
//   VSNAP_BENCH_JSON=<file>: also writes every measurement there.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { HostCache } from '../src/cache/host-cache.js';
import { digestRegions, type DigestTarget } from '../src/digest/index.js';
import { HostRegion } from '../src/regions/host-region.js';
import { runTransfer, type TransferRegion } from '../src/transfer/transfer.js';

const mib = Number(process.argv[2] ?? 2048);
const regionCount = Number(process.argv[3] ?? 8);
const repeats = Number(process.argv[4] ?? 5);
const MiB = 1024 * 1024;
const chunkSize = 64 * MiB;
const regionSize = Math.floor((mib * MiB) / regionCount / 4096) * 4096;
const total = regionSize * regionCount;
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  // The RAM-tier copy: a capture landed unhashed, as a deferred capture leaves it.
  const cache = await HostCache.create({ budgetBytes: total, pin: false });
  const keys = Array.from({ length: regionCount }, (_, i) => `r${i}`);
  const reservation = cache.reserve('bench', 'bench-0000', keys.map((key) => ({ rank: 0, key, size: regionSize })));
  const source = HostRegion.create(regionSize);
  const pattern = Buffer.alloc(regionSize);
  for (let i = 0; i < regionSize; i += 4) pattern.writeUInt32LE((i * 2654435761) >>> 0, i);
  source.write(0, pattern);
  const inRam = (key: string) => ({ kind: 'buffer' as const, buffer: reservation.buffer, offset: reservation.offsets.get(`0/${key}`)! });
  await runTransfer({ op: 'capture', label: 'bench', hash: false, regions: keys.map((key) => ({ name: key, size: regionSize, chunkSize, memory: source.memory, hostCopy: inRam(key) })) });
  source.close();

  const passes = { fused: [] as number[], 'two-pass': [] as number[], 'hash only': [] as number[] };
  const digestSeconds: number[] = [];
  const capture = async (digest: boolean): Promise<{ seconds: number; digests?: string[][] }> => {
    const dir = mkdtempSync(join(process.env.VSNAP_BENCH_DIR ?? tmpdir(), 'vsnap-bench-persist-'));
    try {
      const regions: TransferRegion[] = keys.map((key) => ({ name: key, size: regionSize, chunkSize, memory: inRam(key), blobPath: join(dir, key) }));
      const t = performance.now();
      const r = await runTransfer({ op: 'capture', label: 'bench', regions, ...(digest ? { digest: true } : {}) });
      return { seconds: (performance.now() - t) / 1000, ...(r.digests ? { digests: r.digests } : {}) };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  };
  const targets: DigestTarget[] = keys.map((key) => ({ size: regionSize, chunkSize, memory: inRam(key) }));
  let agree = true;
  for (let rep = 0; rep < repeats + 1; rep++) {
    const fused = await capture(true);
    const hashed = await capture(false);
    const t = performance.now();
    const separate = await digestRegions(targets);
    const digest = (performance.now() - t) / 1000;
    agree &&= JSON.stringify(fused.digests) === JSON.stringify(separate.digests);
    if (rep === 0) continue; // warm-up
    passes.fused.push(fused.seconds);
    passes['hash only'].push(hashed.seconds);
    passes['two-pass'].push(hashed.seconds + digest);
    digestSeconds.push(digest);
  }
  reservation.abandon();
  cache.close();

  const gb = total / 1e9;
  const ceiling = median(passes['hash only']);
  console.log(`persist of a deferred capture: ${(total / 2 ** 30).toFixed(2)} GiB in ${regionCount} regions, chunks of ${chunkSize / MiB} MiB, ${repeats} reps (median), blobs under ${process.env.VSNAP_BENCH_DIR ?? tmpdir()}`);
  console.log('| pass | median (s) | GB/s | vs hash only |');
  console.log('|---|---:|---:|---:|');
  for (const [name, xs] of Object.entries(passes)) {
    const s = median(xs);
    console.log(`| ${name} | ${s.toFixed(3)} | ${(gb / s).toFixed(2)} | ${(ceiling / s).toFixed(2)}x |`);
  }
  console.log(`separate digest pass alone: ${median(digestSeconds).toFixed(3)} s; fused digests equal the separate pass's: ${agree}`);
  if (process.env.VSNAP_BENCH_JSON) {
    writeFileSync(process.env.VSNAP_BENCH_JSON, JSON.stringify({ bytes: total, regions: regionCount, chunkSize, repeats, passes, digestSeconds, agree }, null, 2));
  }
  if (!agree) process.exitCode = 1;
}

await main();
