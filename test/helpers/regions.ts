import { HostRegion } from '../../src/regions/host-region.js';
import { patternBytes } from '../../src/cli/demo.js';

export { patternBytes };

/** Host regions filled with a seeded pattern, keyed by name. */
export function patternedRegions(sizes: Record<string, number>): Map<string, HostRegion> {
  const out = new Map<string, HostRegion>();
  for (const [key, size] of Object.entries(sizes)) {
    const r = HostRegion.create(size, key);
    const piece = 32 * 1024 * 1024;
    for (let off = 0; off < size; off += piece) r.write(off, patternBytes(key, off, Math.min(piece, size - off)));
    out.set(key, r);
  }
  return out;
}

/** Whether a region holds exactly the pattern of `seed`. */
export function holdsPattern(region: HostRegion, seed: string): boolean {
  const piece = 32 * 1024 * 1024;
  for (let off = 0; off < region.size; off += piece) {
    const n = Math.min(piece, region.size - off);
    if (!region.read(off, n).equals(patternBytes(seed, off, n))) return false;
  }
  return true;
}

export function fillRegion(region: HostRegion, byte: number): void {
  const piece = 32 * 1024 * 1024;
  for (let off = 0; off < region.size; off += piece) region.write(off, Buffer.alloc(Math.min(piece, region.size - off), byte));
}

/** Whether every byte of [offset, offset+length) equals `byte`. */
export function allBytes(region: HostRegion, byte: number, offset = 0, length = region.size - offset): boolean {
  const piece = 32 * 1024 * 1024;
  for (let off = offset; off < offset + length; off += piece) {
    const n = Math.min(piece, offset + length - off);
    if (!region.read(off, n).equals(Buffer.alloc(n, byte))) return false;
  }
  return true;
}
