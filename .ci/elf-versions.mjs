// Reads what an ELF shared object needs from the libraries it links: its DT_NEEDED entries and
// the symbol versions it requires of each (.gnu.version_r), e.g. libc.so.6 -> GLIBC_2.34.
// Plain JavaScript, so CI checks binaries of any architecture without binutils for it.
import { readFileSync } from 'node:fs';

const SHT_DYNAMIC = 6;
const SHT_GNU_VERNEED = 0x6ffffffe;
const DT_NEEDED = 1;

/** @returns {{ machine: number, needed: string[], versions: Record<string, string[]> }} */
export function elfNeeds(path) {
  const b = readFileSync(path);
  if (b.readUInt32BE(0) !== 0x7f454c46) throw new Error(`${path} is not an ELF file`);
  if (b[4] !== 2 || b[5] !== 1) throw new Error(`${path}: only 64-bit little-endian ELF is supported`);
  const machine = b.readUInt16LE(18);
  const shoff = Number(b.readBigUInt64LE(0x28));
  const shentsize = b.readUInt16LE(0x3a);
  const shnum = b.readUInt16LE(0x3c);
  const sections = [];
  for (let i = 0; i < shnum; i++) {
    const o = shoff + i * shentsize;
    sections.push({
      type: b.readUInt32LE(o + 4),
      offset: Number(b.readBigUInt64LE(o + 0x18)),
      size: Number(b.readBigUInt64LE(o + 0x20)),
      link: b.readUInt32LE(o + 0x28),
      info: b.readUInt32LE(o + 0x2c),
    });
  }
  const str = (section, at) => {
    const start = sections[section].offset + at;
    return b.toString('latin1', start, b.indexOf(0, start));
  };
  const needed = [];
  const versions = {};
  for (const s of sections) {
    if (s.type === SHT_DYNAMIC) {
      for (let o = s.offset; o < s.offset + s.size; o += 16) {
        const tag = Number(b.readBigInt64LE(o));
        if (tag === 0) break;
        if (tag === DT_NEEDED) needed.push(str(s.link, Number(b.readBigUInt64LE(o + 8))));
      }
    }
    if (s.type === SHT_GNU_VERNEED) {
      let o = s.offset;
      for (let n = 0; n < s.info; n++) {
        const cnt = b.readUInt16LE(o + 2);
        const file = str(s.link, b.readUInt32LE(o + 4));
        let a = o + b.readUInt32LE(o + 8);
        const list = (versions[file] ??= []);
        for (let k = 0; k < cnt; k++) {
          list.push(str(s.link, b.readUInt32LE(a + 8)));
          a += b.readUInt32LE(a + 12);
        }
        const next = b.readUInt32LE(o + 12);
        if (next === 0) break;
        o += next;
      }
    }
  }
  return { machine, needed, versions };
}

/** Compares dotted versions: negative, zero or positive. */
export function compareVersions(a, b) {
  const x = a.split('.').map(Number);
  const y = b.split('.').map(Number);
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The highest version with this prefix (GLIBC_, GLIBCXX_, CXXABI_) the object needs, or null. */
export function highest(needs, prefix) {
  const all = Object.values(needs.versions).flat().filter((v) => v.startsWith(prefix) && /^[A-Z]+_[0-9.]+$/.test(v));
  const nums = all.map((v) => v.slice(prefix.length)).filter((v) => /^[0-9]/.test(v));
  return nums.sort(compareVersions).at(-1) ?? null;
}
