// vsnap-c1 codec microbench (device only): per dtype, the compression ratio and GPU encode and
// decode throughput (GB/s of raw bytes) of one chunk, beside a device-to-device copy of the same
// bytes in the same run, and whether the GPU's coded bytes equal the CPU's.
// argv: [MiB per chunk, default 64] [repeats, default 10] [out.json]. Weights are Gaussian draws
// (sigma 0.02) and heavy-tailed ones (Cauchy), with NaN/Inf/denormals/-0 mixed in.
import { writeFileSync } from 'node:fs';

import { cudaStatus } from '../../src/index.js';
import { listDevices } from '../../src/plumbing.js';
import { native } from '../../src/native/index.js';
import { codecKindNumber, type CodecKind } from '../../src/transfer/codec.js';
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
  const b = await native().codecBenchDevice(c.bytes, codecKindNumber(c.hint), 0, reps);
  const gbps = (ms: number) => size / (ms / 1000) / 1e9;
  rows.push({
    chunk: c.name,
    mode: b.mode === 0 ? 'raw' : `planes/${['', 'bytes', 'bf16', 'fp16', 'fp32', 'e4m3', 'e5m2'][b.kind]} w${b.width}`,
    ratio: b.codedSize / b.rawSize,
    decodeGBps: gbps(median(b.decodeMs)),
    encodeGBps: gbps(median(b.encodeMs)),
    copyGBps: gbps(median(b.copyMs)),
    decodeMs: median(b.decodeMs),
    encodeMs: median(b.encodeMs),
    sameAsCpu: b.sameAsCpu,
    roundTrip: b.roundTrip,
  });
  console.error(`${c.name}: ${JSON.stringify(rows.at(-1))}`); // progress, in case the run is cut short
}
const lines = [
  `# vsnap-c1 codec on ${device.name}: chunks of ${mibArg} MiB, median of ${reps} (GB/s of raw bytes; copy = device-to-device copy of the raw bytes)`,
  '',
  '| chunk | coded as | ratio | decode GB/s | encode GB/s | D2D copy GB/s | GPU bytes = CPU bytes | round trip |',
  '|---|---|---|---|---|---|---|---|',
  ...rows.map((r) => `| ${r.chunk} | ${r.mode} | ${r.ratio.toFixed(4)} | ${r.decodeGBps.toFixed(0)} | ${r.encodeGBps.toFixed(1)} | ${r.copyGBps.toFixed(0)} | ${r.sameAsCpu} | ${r.roundTrip} |`),
];
console.log(lines.join('\n'));
if (outFile) writeFileSync(outFile, JSON.stringify({ device: device.name, chunkBytes: size, repeats: reps, rows }, null, 2));
if (rows.some((r) => !r.sameAsCpu || !r.roundTrip)) process.exitCode = 1;
