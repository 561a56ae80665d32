// vsnap-c1 codec microbench (device only): per dtype, the compression ratio and GPU encode and
// decode throughput (GB/s of raw bytes, the kernels' own time) of one chunk through vsnap/plumbing,
// and whether the GPU's coded bytes equal the CPU's.
// argv: [MiB per chunk, default 64] [repeats, default 10] [out.json]. Weights are Gaussian draws
// (sigma 0.02) and heavy-tailed ones (Cauchy), with NaN/Inf/denormals/-0 mixed in.
import { writeFileSync } from 'node:fs';

import { cudaStatus } from '../../src/index.js';
import { decodeChunk, decodeChunkOnDevice, encodeChunk, encodeChunkOnDevice, inspectChunk, listDevices, type CodecKind } from '../../src/plumbing.js';
import { randomChunk, weights } from '../helpers/codec-data.js';

const [mibArg = '64', repsArg = '10', outFile] = process.argv.slice(2);
const size = Number(mibArg) * 1024 * 1024;
const reps = Number(repsArg);
const median = (v: number[]): number => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;

const status = await cudaStatus();
if (!status.available) throw new Error(`the codec bench needs a GPU: ${status.reason}`);
const device = (await listDevices())[0]!;

/** A chunk of `size` bytes made of a 16 MiB sample repeated (the same statistics, generated fast). */
function tile(sample: Buffer): Buffer {
  const out = Buffer.alloc(size);
  for (let at = 0; at < size; at += sample.length) sample.copy(out, at, 0, Math.min(sample.length, size - at));
  return out;
}

const sampleSize = Math.min(size, 16 * 1024 * 1024);
const cases: Array<{ name: string; hint: CodecKind; bytes: Buffer }> = [];
for (const kind of ['bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2'] as const) {
  for (const draw of ['gaussian', 'heavy'] as const) cases.push({ name: `${kind} ${draw}`, hint: kind, bytes: tile(weights(kind, draw, sampleSize, 31)) });
}
cases.push({ name: 'random bytes', hint: 'bytes', bytes: tile(randomChunk(sampleSize, 5)) }, { name: 'zeros', hint: 'bytes', bytes: Buffer.alloc(size) });

const rows = [];
for (const c of cases) {
  const encodeMs: number[] = [];
  const decodeMs: number[] = [];
  let coded: Buffer = Buffer.alloc(0);
  let sameAsCpu = true;
  let roundTrip = true;
  const cpu = encodeChunk(c.bytes, c.hint);
  for (let i = 0; i < reps; i++) {
    const e = await encodeChunkOnDevice(c.bytes, c.hint, 0);
    encodeMs.push(e.kernelMs);
    coded = e.coded;
    sameAsCpu &&= e.coded.equals(cpu);
    const d = await decodeChunkOnDevice(e.coded, c.bytes.length, 0, { chunk: 0, region: c.name });
    decodeMs.push(d.kernelMs);
    roundTrip &&= d.data.equals(c.bytes);
  }
  roundTrip &&= decodeChunk(coded, c.bytes.length, { chunk: 0, region: c.name }).equals(c.bytes);
  const info = inspectChunk(coded, c.bytes.length, { chunk: 0, region: c.name });
  const gbps = (ms: number) => size / (ms / 1000) / 1e9;
  rows.push({
    chunk: c.name,
    mode: info.mode === 'raw' ? 'raw' : `planes/${info.kind} w${info.width}`,
    ratio: info.codedSize / info.rawSize,
    decodeGBps: gbps(median(decodeMs)),
    encodeGBps: gbps(median(encodeMs)),
    decodeMs: median(decodeMs),
    encodeMs: median(encodeMs),
    sameAsCpu,
    roundTrip,
  });
  console.error(`${c.name}: ${JSON.stringify(rows.at(-1))}`); // progress, in case the run is cut short
}
const lines = [
  `# vsnap-c1 codec on ${device.name}: chunks of ${mibArg} MiB, median of ${reps} kernel times (GB/s of raw bytes)`,
  '',
  '| chunk | coded as | ratio | decode GB/s | encode GB/s | GPU bytes = CPU bytes | round trip |',
  '|---|---|---|---|---|---|---|',
  ...rows.map((r) => `| ${r.chunk} | ${r.mode} | ${r.ratio.toFixed(4)} | ${r.decodeGBps.toFixed(0)} | ${r.encodeGBps.toFixed(1)} | ${r.sameAsCpu} | ${r.roundTrip} |`),
];
console.log(lines.join('\n'));
if (outFile) writeFileSync(outFile, JSON.stringify({ device: device.name, chunkBytes: size, repeats: reps, rows }, null, 2));
if (rows.some((r) => !r.sameAsCpu || !r.roundTrip)) process.exitCode = 1;
