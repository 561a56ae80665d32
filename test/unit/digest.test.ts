import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';

import { describe, expect, it } from 'vitest';

import { digestChunk, digestChunks, digestRegions } from '../../src/digest/index.js';
import { VsnapError } from '../../src/errors.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { native } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { blobDigest } from '../../src/manifest/blob-digest.js';

// Fixed vectors of vsnap-gd1 (native/digest/digest_mix.h). They were computed three ways that
// agree: the native CPU code, the TypeScript port, and a big-integer Python transcription of the
// spec in the header's comment. The GPU suite checks the kernel against the CPU on device memory.
const seq = Buffer.from(Array.from({ length: 10000 }, (_, i) => (i * 31 + 7) & 255));
const VECTORS: Array<[string, Buffer, number, string[]]> = [
  ['empty', Buffer.alloc(0), 4096, []],
  ['"abc"', Buffer.from('abc'), 4096, ['9841fda9a538111b2f37debfe753d396']],
  ['one byte 0x01', Buffer.from([1]), 4096, ['be061f5ba7f487d7647f270c96ff8732']],
  ['8 KiB of zeros', Buffer.alloc(8192), 4096, ['591fe4b9b42278c806d211eba34c91ee', '591fe4b9b42278c806d211eba34c91ee']],
  ['10000 sequence bytes', seq, 4096, ['ac1a4f2ae8e0b8c672b526e37bfe587d', 'ac1a4f2ae8e0b8c672b526e37bfe587d', '16e05f28a738a3c034c65bb149463ae6']],
];

describe('vsnap-gd1, the GPU digest, on the CPU', () => {
  it.each(VECTORS)('fixed vector: %s (native and TypeScript)', (_name, data, chunk, expected) => {
    expect(native().digestBytes(data, chunk)).toEqual(expected);
    expect(digestChunks(data, chunk)).toEqual(expected);
  });

  it('the native CPU code and the TypeScript port agree on random data of awkward sizes', () => {
    for (const size of [1, 7, 8, 9, 15, 16, 17, 31, 4095, 4097, 12289, 65536 + 3]) {
      const data = randomBytes(size);
      expect(native().digestBytes(data, 4096), `size ${size}`).toEqual(digestChunks(data, 4096));
    }
  });

  it('sees every single-byte change, moved words, and trailing zeros', () => {
    const data = randomBytes(4096);
    const base = digestChunk(data);
    for (const at of [0, 1, 7, 8, 2047, 4095]) {
      const changed = Buffer.from(data);
      changed[at]! ^= 1;
      expect(digestChunk(changed), `byte ${at}`).not.toBe(base);
    }
    const swapped = Buffer.from(data);
    data.copy(swapped, 0, 8, 16);
    data.copy(swapped, 8, 0, 8);
    expect(digestChunk(swapped)).not.toBe(base);
    expect(digestChunk(Buffer.from('abc\0'))).not.toBe(digestChunk(Buffer.from('abc')));
    expect(digestChunk(Buffer.alloc(16))).not.toBe(digestChunk(Buffer.alloc(8)));
  });

  it('digests host regions (the CPU backend) exactly as the bytes they hold', async () => {
    const a = HostRegion.create(3 * 4096 + 5, 'digest-a');
    const b = HostRegion.create(4096, 'digest-b');
    try {
      const bytesA = randomBytes(a.size);
      a.write(0, bytesA);
      const r = await digestRegions([
        { size: a.size, chunkSize: 4096, memory: a.memory },
        { size: b.size, chunkSize: 4096, memory: b.memory },
      ]);
      expect(r.backends).toEqual(['cpu', 'cpu']);
      expect(r.digests[0]).toEqual(digestChunks(bytesA, 4096));
      expect(r.digests[1]).toEqual(digestChunks(Buffer.alloc(4096), 4096));
    } finally {
      a.close();
      b.close();
    }
  });

  it('rejects a chunk size the kernel cannot split, and memory it cannot reach', async () => {
    expect(() => native().digestBytes(Buffer.alloc(64), 10)).toThrow(/multiple of 16/);
    await expect(digestRegions([{ size: 64, chunkSize: 4096, memory: { kind: 'host', fd: 987654 } }])).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    const r = HostRegion.create(4096, 'digest-small');
    try {
      await expect(digestRegions([{ size: 8192, chunkSize: 4096, memory: r.memory }])).rejects.toBeInstanceOf(VsnapError);
    } finally {
      r.close();
    }
  });

  it('the embedded kernel (digest_kernel.inc) was generated from the current kernel sources, and the plugin holds the same fatbin', () => {
    // Fails when digest_kernel.cu or digest_mix.h changed without `node native/gen-kernel.mjs digest`,
    expect(execFileSync('node', ['native/gen-kernel.mjs', 'digest', '--check'], { encoding: 'utf8' })).toMatch(/matches its sources/);
    // or when the vLLM plugin's copy (engines/vllm/vsnap_vllm/digest_kernel.fatbin) is not the .inc's (`node scripts/plugin-kernel.mjs`).
    expect(execFileSync('node', ['scripts/plugin-kernel.mjs', '--check'], { encoding: 'utf8' })).toMatch(/is the \.inc's fatbin/);
  });
});

describe('manifest schema 2: GPU digests', () => {
  const checksums = ['0'.repeat(32), '1'.repeat(32)];
  const region = (extra: Record<string, unknown> = {}) => ({ key: 'w', tag: 'weights', size: 8192, chunkSize: 4096, checksums, blob: blobDigest(8192, 4096, checksums), ...extra });
  const manifest = (version: number, regionExtra: Record<string, unknown> = {}, top: Record<string, unknown> = {}) => ({
    schemaVersion: version,
    id: '0mx26rc38-dff83be0',
    name: 'm',
    createdAt: '2026-11-29T18:00:00.000Z',
    vsnapVersion: '0.1.0',
    checksumAlgorithm: 'xxh3-128',
    platform: { kind: 'host' },
    ranks: [{ rank: 0, device: null, regions: [region(regionExtra)] }],
    ...top,
  });

  it('reads a version-1 manifest as version 2 without digests', () => {
    const m = Manifest.parse(manifest(1));
    expect(m.data.schemaVersion).toBe(2);
    expect(m.data.digestAlgorithm).toBeNull();
    expect(m.data.ranks[0]!.regions[0]!.digests).toBeNull();
  });

  it('keeps version-2 digests and checks there is one per chunk', () => {
    const digests = ['2'.repeat(32), '3'.repeat(32)];
    const m = Manifest.parse(manifest(2, { digests }, { digestAlgorithm: 'vsnap-gd1' }));
    expect(m.data.ranks[0]!.regions[0]!.digests).toEqual(digests);
    expect(() => Manifest.parse(manifest(2, { digests: digests.slice(1) }))).toThrow(/2 chunks need 2 digests, found 1/);
    expect(() => Manifest.parse(manifest(2, { digests: ['xyz', '3'.repeat(32)] }))).toThrow(/vsnap-gd1 digest/);
    expect(() => Manifest.parse(manifest(3))).toThrow(/schema version 3/);
  });
});
