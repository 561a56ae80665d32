// Coded blobs in the manifest and the store (docs/compression.md): a region's `codec` is
// optional (older manifests read as raw) and validated against its chunks and blob name; a coded
// blob published through a capture transaction reads back chunk by chunk, decoded and checked
// against the raw bytes' checksums, and damage is reported naming the chunk.
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { blobDigest, codedBlobDigest } from '../../src/manifest/blob-digest.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { native } from '../../src/native/index.js';
import { codedOffsets, encodeBlob, readBlobChunk } from '../../src/store/coded-blob.js';
import { RegionStore } from '../../src/store/region-store.js';
import { weights } from '../helpers/codec-data.js';

const CHUNK = 64 * 1024;

/** Replaces a published (read-only) blob with other bytes. */
function rewrite(path: string, bytes: Uint8Array): void {
  rmSync(path);
  writeFileSync(path, bytes);
}

function manifestData(id: string, name: string, regions: Array<Record<string, unknown>>): Record<string, unknown> {
  return {
    schemaVersion: 2,
    id,
    name,
    createdAt: '2026-12-07T18:00:00.000Z',
    vsnapVersion: '0.1.0',
    checksumAlgorithm: 'xxh3-128',
    engine: { kind: 'vllm', version: '0.30.1', attentionBackend: 'TRITON_ATTN' },
    model: { id: 'meta/llama', dtype: 'bfloat16', tensorParallelSize: 1 },
    platform: { kind: 'cuda', gpuName: 'NVIDIA H100', computeCapability: '9.0', driverCudaVersion: 13000, vmmGranularity: 2097152 },
    ranks: [{ rank: 0, device: { uuid: 'GPU-1', name: 'NVIDIA H100' }, regions }],
  };
}

function checksums(bytes: Buffer): string[] {
  const out: string[] = [];
  for (let at = 0; at < bytes.length; at += CHUNK) out.push(native().checksum(bytes.subarray(at, at + CHUNK)));
  return out;
}

function issuesOf(fn: () => unknown): Array<{ path: string; message: string }> {
  try {
    fn();
  } catch (err) {
    expect((err as VsnapError).code).toBe('E_MANIFEST_INVALID');
    return (err as VsnapError).details.issues as Array<{ path: string; message: string }>;
  }
  throw new Error('expected E_MANIFEST_INVALID');
}

const raw = weights('bf16', 'gaussian', 3 * CHUNK + 1001, 41);
const sums = checksums(raw);
const coded = encodeBlob(raw, CHUNK, sums, 'bf16');
const codedRegion = { key: 'layers.0.weight', tag: 'weights', size: raw.length, chunkSize: CHUNK, checksums: sums, blob: coded.digest, codec: coded.codec };

describe('the manifest records coded regions', () => {
  it('reads a region without `codec` as raw (every manifest before the codec), and keeps `codec` through JSON', () => {
    const plain = Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [{ ...codedRegion, codec: undefined, blob: blobDigest(raw.length, CHUNK, sums) }]));
    expect(plain.data.ranks[0]!.regions[0]!.codec).toBeUndefined();
    expect(JSON.stringify(plain.toJSON())).not.toContain('codec');
    const m = Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [codedRegion]));
    expect(m.data.ranks[0]!.regions[0]!.codec).toEqual(coded.codec);
    expect(Manifest.parse(JSON.stringify(m.toJSON())).toJSON()).toEqual(m.toJSON());
  });

  it('names a coded blob by the decoded content and the coded sizes, never by the raw name', () => {
    expect(coded.digest).toBe(codedBlobDigest(raw.length, CHUNK, sums, 'vsnap-c1', coded.codec.codedSizes));
    expect(coded.digest).not.toBe(blobDigest(raw.length, CHUNK, sums));
    const issues = issuesOf(() => Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [{ ...codedRegion, blob: blobDigest(raw.length, CHUNK, sums) }])));
    expect(issues.map((i) => i.path)).toEqual(['ranks[0].regions[0].blob']);
  });

  it('refuses coded sizes that do not fit the chunks', () => {
    const sizes = [...coded.codec.codedSizes];
    const wrongCount = issuesOf(() => Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [{ ...codedRegion, codec: { name: 'vsnap-c1', codedSizes: sizes.slice(1) } }])));
    expect(wrongCount[0]!.path).toBe('ranks[0].regions[0].codec.codedSizes');
    const tooLarge = [...sizes];
    tooLarge[3] = 1001 + 65;
    const big = issuesOf(() => Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [{ ...codedRegion, codec: { name: 'vsnap-c1', codedSizes: tooLarge } }])));
    expect(big.map((i) => i.path)).toContain('ranks[0].regions[0].codec.codedSizes[3]');
    const unknown = issuesOf(() => Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [{ ...codedRegion, codec: { name: 'zstd', codedSizes: sizes } }])));
    expect(unknown[0]!.path).toBe('ranks[0].regions[0].codec.name');
  });
});

describe('the store holds coded blobs', () => {
  let dir: string | undefined;
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    dir = undefined;
  });

  async function published(): Promise<{ store: RegionStore; path: string; manifest: Manifest }> {
    dir = mkdtempSync(join(tmpdir(), 'vsnap-coded-'));
    const store = await RegionStore.open(join(dir, 'store'));
    const txn = await store.beginCapture('m', coded.bytes.length);
    writeFileSync(txn.blobTmpPath(0), coded.bytes);
    const manifest = Manifest.parse(manifestData(txn.id, 'm', [codedRegion]));
    await txn.publish(manifest, [{ tmpPath: txn.blobTmpPath(0), digest: coded.digest, size: coded.bytes.length }]);
    return { store, path: store.blobPath(coded.digest), manifest: await store.get('m') };
  }

  it('publishes a coded blob, smaller than the region, and reads every chunk back as the raw bytes', async () => {
    const { path, manifest } = await published();
    const region = manifest.data.ranks[0]!.regions[0]!;
    expect(statSync(path).size).toBe(codedOffsets(region.codec!).at(-1));
    expect(statSync(path).size / raw.length).toBeLessThan(0.75);
    const back = await Promise.all(sums.map((_, i) => readBlobChunk(path, region, i, 'm')));
    expect(Buffer.concat(back).equals(raw)).toBe(true);
  });

  it('reports a damaged coded chunk naming it: its structure (E_CODEC_CORRUPT), its decoded bytes (E_CHECKSUM), a short blob (E_BLOB_TRUNCATED)', async () => {
    const { path, manifest } = await published();
    const region = manifest.data.ranks[0]!.regions[0]!;
    const offsets = codedOffsets(region.codec!);
    const bytes = readFileSync(path);
    const at = async (i: number) => readBlobChunk(path, region, i, 'm').then(() => undefined, (err: VsnapError) => err);

    bytes[offsets[1]! + 8] = bytes[offsets[1]! + 8]! ^ 1; // chunk 1's raw size in its header
    rewrite(path, bytes);
    const structural = await at(1);
    expect(structural?.code).toBe('E_CODEC_CORRUPT');
    expect(structural?.message).toContain('chunk 1 of region layers.0.weight in snapshot m is damaged');
    expect(await at(0)).toBeUndefined(); // the other chunks still read

    bytes[offsets[1]! + 8] = bytes[offsets[1]! + 8]! ^ 1;
    bytes[offsets[2]! - 100] = bytes[offsets[2]! - 100]! ^ 0x01; // inside chunk 1's last section: decodes, to other bytes
    rewrite(path, bytes);
    const content = await at(1);
    expect(content?.code).toMatch(/^E_CHECKSUM$|^E_CODEC_CORRUPT$/);
    expect(content?.details).toMatchObject({ chunk: 1, region: 'layers.0.weight' });

    rewrite(path, bytes.subarray(0, offsets[3]! + 10));
    expect((await at(3))?.code).toBe('E_BLOB_TRUNCATED');
  });

  it('verify decodes every coded chunk against its checksum, and reports a damaged one for its region', async () => {
    const { store, path, manifest } = await published();
    expect(await store.verify('m')).toMatchObject({ ok: true, problems: [] });
    const offsets = codedOffsets(manifest.data.ranks[0]!.regions[0]!.codec!);
    const bytes = readFileSync(path);
    bytes[offsets[2]! + 5] = 9; // chunk 2's mode
    rewrite(path, bytes);
    const report = await store.verify('m');
    expect(report.ok).toBe(false);
    expect(report.problems).toEqual([expect.objectContaining({ rank: 0, region: 'layers.0.weight', code: 'E_CODEC_CORRUPT' })]);
    expect(report.problems[0]!.message).toContain('chunk 2 of region layers.0.weight in snapshot m is damaged');
  });

  it('reads raw blobs (regions without `codec`) the same way', async () => {
    dir = mkdtempSync(join(tmpdir(), 'vsnap-coded-'));
    const path = join(dir, 'raw.blob');
    writeFileSync(path, raw);
    const region = Manifest.parse(manifestData('0mx26rc38-dff83be0', 'm', [{ ...codedRegion, codec: undefined, blob: blobDigest(raw.length, CHUNK, sums) }])).data.ranks[0]!.regions[0]!;
    expect((await readBlobChunk(path, region, 3)).equals(raw.subarray(3 * CHUNK))).toBe(true);
    expect((await readBlobChunk(path, region, 0).catch((e: VsnapError) => e)) instanceof VsnapError).toBe(false);
  });
});
