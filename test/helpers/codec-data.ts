// Chunks of every kind the codec meets (test/unit/codec.test.ts, test/gpu/codec.gpu.test.ts,
// test/microbench/codec.ts): weights of each dtype from Gaussian and heavy-tailed draws with NaN, Inf,
// denormals and negative zero mixed in, random bytes, zeros, constants. Seeded: the same bytes
// on every run.
import type { CodecKind } from '../../src/plumbing.js';
import { prng } from '../reliability/figures.js';

/** A seeded generator of numbers in [0, 1): the reliability suite's mulberry32, seed 0 read as 1. */
export function rng(seed: number): () => number {
  return prng(seed >>> 0 || 1);
}

/** Draws: Gaussian (sigma 0.02, like trained weights) or heavy-tailed (Cauchy, scale 0.02). */
export type Draw = 'gaussian' | 'heavy';

function values(count: number, draw: Draw, seed: number): Float32Array {
  const r = rng(seed);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    if (draw === 'gaussian') {
      const u = r() || 1e-12;
      out[i] = 0.02 * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * r());
    } else {
      out[i] = 0.02 * Math.tan(Math.PI * (r() - 0.5));
    }
  }
  return out;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
function bitsOf(x: number): number {
  f32[0] = x;
  return u32[0]!;
}

/** A float as a minifloat of expBits/manBits (IEEE-like, truncating; NaN all ones, overflow to the largest finite). */
function minifloat(x: number, expBits: number, manBits: number): number {
  const b = bitsOf(x);
  const sign = b >>> 31;
  const top = (1 << expBits) - 1;
  if (Number.isNaN(x)) return (sign << (expBits + manBits)) | (top << manBits) | ((1 << manBits) - 1);
  const bias = (1 << (expBits - 1)) - 1;
  let e = ((b >>> 23) & 255) - 127 + bias;
  let m = (b >>> (23 - manBits)) & ((1 << manBits) - 1);
  if (e <= 0) {
    // denormal: shift the implicit one in
    const shift = 1 - e;
    m = shift > manBits + 1 ? 0 : (((1 << manBits) | m) >>> shift) & ((1 << manBits) - 1);
    e = 0;
  } else if (e >= top) {
    e = top - 1;
    m = (1 << manBits) - 1;
  }
  return (sign << (expBits + manBits)) | (e << manBits) | m;
}

/** Bit patterns of specials of a kind: NaN, +-Inf, denormals, negative zero. */
function specials(kind: CodecKind): number[] {
  switch (kind) {
    case 'bf16': return [0x7fc0, 0xffc1, 0x7f80, 0xff80, 0x0001, 0x807f, 0x8000];
    case 'fp16': return [0x7e00, 0xfc01, 0x7c00, 0xfc00, 0x0001, 0x83ff, 0x8000];
    case 'fp32': return [0x7fc00000, 0xffc00001, 0x7f800000, 0xff800000, 0x00000001, 0x807fffff, 0x80000000];
    case 'fp8-e4m3': return [0x7f, 0xff, 0x01, 0x87, 0x80];
    case 'fp8-e5m2': return [0x7e, 0xff, 0x7c, 0xfc, 0x01, 0x83, 0x80];
    default: return [0];
  }
}

/** Bytes of one element of a kind. */
export function elementBytes(kind: CodecKind): number {
  return kind === 'fp32' ? 4 : kind === 'bf16' || kind === 'fp16' ? 2 : 1;
}

/**
 * `size` bytes of weights of a float kind (a whole number of elements, then `size % elementBytes`
 * tail bytes), with about one element in 500 a special (NaN, Inf, denormal, -0).
 */
export function weights(kind: Exclude<CodecKind, 'bytes'>, draw: Draw, size: number, seed = 1): Buffer {
  const e = elementBytes(kind);
  const n = Math.floor(size / e);
  const v = values(n, draw, seed);
  const out = Buffer.alloc(size);
  const sp = specials(kind);
  const r = rng(seed ^ 0x5bd1e995);
  for (let i = 0; i < n; i++) {
    let bits: number;
    if (r() < 0.002) bits = sp[Math.floor(r() * sp.length)]!;
    else if (kind === 'bf16') bits = bitsOf(v[i]!) >>> 16;
    else if (kind === 'fp16') bits = minifloat(v[i]!, 5, 10);
    else if (kind === 'fp32') bits = bitsOf(v[i]!);
    else if (kind === 'fp8-e4m3') bits = minifloat(v[i]! * 100, 4, 3); // scaled into E4M3's range, as FP8 weights are
    else bits = minifloat(v[i]! * 100, 5, 2);
    if (e === 1) out[i] = bits;
    else if (e === 2) out.writeUInt16LE(bits, 2 * i);
    else out.writeUInt32LE(bits >>> 0, 4 * i);
  }
  for (let i = n * e; i < size; i++) out[i] = Math.floor(r() * 256);
  return out;
}

/** `size` random bytes (seeded). */
export function randomChunk(size: number, seed = 1): Buffer {
  const r = rng(seed);
  const out = Buffer.alloc(size);
  for (let i = 0; i < size; i++) out[i] = Math.floor(r() * 256);
  return out;
}

/** One chunk of each kind the codec must round-trip, with the hint an engine would give it. */
export function corpus(size: number): Array<{ name: string; bytes: Buffer; hint: CodecKind }> {
  const out: Array<{ name: string; bytes: Buffer; hint: CodecKind }> = [
    { name: 'random bytes', bytes: randomChunk(size, 7), hint: 'bytes' },
    { name: 'random bytes hinted bf16', bytes: randomChunk(size, 8), hint: 'bf16' },
    { name: 'zeros', bytes: Buffer.alloc(size), hint: 'bytes' },
    { name: 'zeros hinted bf16', bytes: Buffer.alloc(size), hint: 'bf16' },
    { name: 'constant 0x3c', bytes: Buffer.alloc(size, 0x3c), hint: 'fp16' },
  ];
  for (const kind of ['bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2'] as const) {
    for (const draw of ['gaussian', 'heavy'] as const) out.push({ name: `${kind} ${draw}`, bytes: weights(kind, draw, size, 3), hint: kind });
  }
  return out;
}
