/**
 * A TypeScript port of the vsnap-gd1 chunk digest (native/digest/digest_mix.h), for checking
 * the native CPU and GPU implementations against fixed vectors and against each other. The
 * SDK itself digests through the addon (the same header on the CPU and in the kernel).
 */

const TWO32 = 2 ** 32;
const K1 = 0x9e3779b1;
const K2 = 0x85ebca77;
const K3 = 0xc2b2ae3d;
const MASK64 = (1n << 64n) - 1n;

/** The exact 64-bit product of two u32 as [high, low] u32 halves. */
function mul32(a: number, b: number): [number, number] {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const b0 = b & 0xffff;
  const b1 = b >>> 16;
  const mid = a0 * b1 + a1 * b0; // < 2^33
  const low = a0 * b0 + (mid % 65536) * 65536; // < 2^33, exact in a double
  const carry = Math.floor(low / TWO32);
  return [(a1 * b1 + Math.floor(mid / 65536) + carry) >>> 0, low >>> 0];
}

function mix64(z: bigint): bigint {
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return z ^ (z >> 31n);
}

/** The digest of one chunk (any length), as 32 lowercase hex digits. */
export function digestChunk(chunk: Uint8Array): string {
  let aHi = 0;
  let aLo = 0;
  let bHi = 0;
  let bLo = 0;
  const absorb = (wLo: number, wHi: number, t: number): void => {
    const lo = (wLo ^ Math.imul(t, K1)) >>> 0;
    const hi = (wHi ^ ((Math.imul(t, K2) + K3) >>> 0)) >>> 0;
    const [pHi, pLo] = mul32(lo, hi);
    aLo += pLo;
    aHi = (aHi + pHi + (aLo >= TWO32 ? 1 : 0)) >>> 0;
    aLo %= TWO32;
    bLo += lo;
    bHi = (bHi + hi + (bLo >= TWO32 ? 1 : 0)) >>> 0;
    bLo %= TWO32;
  };
  const view = new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  const words = Math.floor(chunk.length / 8);
  for (let j = 0; j < words; j++) absorb(view.getUint32(8 * j, true), view.getUint32(8 * j + 4, true), j >>> 0);
  if (chunk.length % 8) {
    const tail = new Uint8Array(8);
    tail.set(chunk.subarray(8 * words));
    const tv = new DataView(tail.buffer);
    absorb(tv.getUint32(0, true), tv.getUint32(4, true), words >>> 0);
  }
  const a = (BigInt(aHi) << 32n) | BigInt(aLo);
  const b = (BigInt(bHi) << 32n) | BigInt(bLo);
  const h0 = mix64((a + 0x9e3779b97f4a7c15n * BigInt(chunk.length + 1)) & MASK64);
  const h1 = mix64(b ^ h0 ^ 0xc2b2ae3d27d4eb4fn);
  return h0.toString(16).padStart(16, '0') + h1.toString(16).padStart(16, '0');
}

/** The digests of `data` in chunks of `chunkSize` bytes (the last one may be shorter). */
export function digestChunks(data: Uint8Array, chunkSize: number): string[] {
  const out: string[] = [];
  for (let at = 0; at < data.length; at += chunkSize) out.push(digestChunk(data.subarray(at, Math.min(at + chunkSize, data.length))));
  return out;
}
