// Seeded Gaussian BF16 weights (sigma 0.02), the statistics of the reference engine's matrices:
// the bench's own, so it imports nothing of the tests.

/** `size` bytes of BF16 values drawn from N(0, 0.02²), the same bytes for the same seed. */
export function gaussianBf16(size: number, seed: number): Buffer {
  let a = seed >>> 0 || 1;
  const uniform = (): number => {
    // mulberry32
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const out = Buffer.alloc(size);
  const f = new Float32Array(1);
  const bits = new Uint32Array(f.buffer);
  for (let i = 0; i + 1 < size; i += 2) {
    f[0] = 0.02 * Math.sqrt(-2 * Math.log(uniform() || 1e-12)) * Math.cos(2 * Math.PI * uniform()); // Box-Muller
    out.writeUInt16LE(bits[0]! >>> 16, i);
  }
  return out;
}
