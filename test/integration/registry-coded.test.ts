// Coded snapshots (CaptureOptions.codec 'vsnap-c1') pushed to and pulled from the real CNCF
// distribution registry (Debian's docker-registry, plain HTTP on loopback): the layers carry the
// coded blobs (fewer bytes each way), the pulled store holds the same blobs under the same names
// and restores them bit-exact, and a coded layer damaged in the registry is refused with nothing
// stored.
import { closeSync, openSync, readdirSync, readFileSync, writeSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { REGION_CODED_MEDIA_TYPE, REGION_MEDIA_TYPE } from '../../src/registry/artifact.js';
import { RegistryClient } from '../../src/registry/registry.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { codedOffsets, storedBytes } from '../../src/store/coded-blob.js';
import { RegionStore } from '../../src/store/region-store.js';
import { randomChunk, weights } from '../helpers/codec-data.js';
import { fillRegion } from '../helpers/regions.js';
import { registryAvailable, startRegistry, type TestRegistry } from '../helpers/registry.js';
import { rejection } from '../helpers/rejection.js';
import { tempDir } from '../helpers/tmp.js';

const KiB = 1024;
const CHUNK = 256 * KiB;
const run = registryAvailable();

const contents: Record<string, Buffer> = {
  'bf16.layers.0.weight': weights('bf16', 'gaussian', 5 * CHUNK + 1000, 21),
  'bf16.layers.1.weight': weights('bf16', 'heavy', 2 * CHUNK, 22),
  'random.bias': randomChunk(CHUNK + 12, 23),
};

async function captured(root: string, codec: 'vsnap-c1' | 'off', name = 'm'): Promise<RegionStore> {
  const store = await RegionStore.open(root);
  const held: HostRegion[] = [];
  try {
    const regions = Object.entries(contents).map(([key, bytes]) => {
      const r = HostRegion.create(bytes.length);
      held.push(r);
      r.write(0, bytes);
      const tensors = key.startsWith('bf16') ? [{ name: key, offset: 0, dtype: 'torch.bfloat16', shape: [bytes.length / 2] }] : [];
      return { key, size: bytes.length, memory: r.memory, tensors };
    });
    await Snapshot.capture(store, name, { regions, chunkSize: CHUNK, codec });
  } finally {
    for (const r of held) r.close();
  }
  return store;
}

async function restoredEqual(store: RegionStore, name: string): Promise<boolean> {
  const targets = Object.entries(contents).map(([key, bytes]) => {
    const r = HostRegion.create(bytes.length);
    fillRegion(r, 0x5a);
    return { key, size: bytes.length, region: r };
  });
  try {
    await (await Snapshot.open(store, name)).restore({ regions: targets.map(({ key, size, region }) => ({ key, size, memory: region.memory })) });
    return targets.every((t) => t.region.read(0, t.size).equals(contents[t.key]!));
  } finally {
    for (const t of targets) t.region.close();
  }
}

/** The OCI manifest's layers under `repo:tag`, read from the registry directly. */
async function layersOf(reg: TestRegistry, repo: string, tag: string): Promise<Array<{ mediaType: string; digest: string; size: number; annotations?: Record<string, string> }>> {
  const res = await fetch(`http://${reg.host}/v2/${repo}/manifests/${tag}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
  expect(res.status).toBe(200);
  return ((await res.json()) as { layers: Array<{ mediaType: string; digest: string; size: number; annotations?: Record<string, string> }> }).layers;
}

describe.skipIf(!run)('registry: coded snapshots', () => {
  let reg: TestRegistry;
  let dir: string;
  beforeAll(async () => {
    dir = tempDir();
    reg = await startRegistry(dir, {});
  }, 30_000);
  afterAll(async () => {
    await reg?.close();
  });
  const client = (extra: object = {}) => new RegistryClient({ dockerConfig: false, stateDir: join(dir, 'state'), chunkBytes: 128 * KiB, ...extra });

  it('pushes the coded blobs as layers, pulls them (whole and in Range parts) into stores that restore bit-exact, and a second push sends nothing', async () => {
    const src = await captured(join(tempDir(), 's'), 'vsnap-c1');
    const manifest = await src.get('m');
    const stored = manifest.storedBytes;
    expect(stored).toBeLessThan(0.8 * manifest.totalBytes);
    const ref = `${reg.prefix}/team/coded:v1`;
    const first = await client().push(src, 'm', ref);
    expect(first.bytesUploaded).toBe(stored);
    const media = (await layersOf(reg, 'team/coded', 'v1')).map((l) => [l.annotations?.['dev.vsnap.region.key'], l.mediaType, l.size]);
    expect(media).toEqual(
      [...manifest.regions()].map(({ region }) => [region.key, region.codec ? REGION_CODED_MEDIA_TYPE : REGION_MEDIA_TYPE, storedBytes(region)]),
    );
    expect(media.filter(([, m]) => m === REGION_CODED_MEDIA_TYPE)).toHaveLength(2);

    await reg.mark();
    const again = await client().push(src, 'm', ref);
    expect(again).toMatchObject({ bytesUploaded: 0, bytesSkipped: stored, digest: first.digest });
    expect((await reg.mark()).filter((r) => r.method === 'PATCH' || r.method === 'POST')).toEqual([]);

    for (const extra of [{}, { rangeMinBytes: 64 * KiB, connections: 3 }]) {
      const dst = await RegionStore.open(join(tempDir(), 'd'));
      await reg.mark();
      const pulled = await client(extra).pull(dst, ref, { name: 'copy' });
      expect(pulled).toMatchObject({ digest: first.digest, bytesDownloaded: stored, bytesSkipped: 0 });
      if ('rangeMinBytes' in extra) expect((await reg.mark()).filter((r) => r.method === 'GET' && r.path.includes('/blobs/')).length).toBeGreaterThan(4);
      const copy = await dst.get('copy');
      expect(copy.data.ranks).toEqual(manifest.data.ranks); // same regions, codecs and blob names
      for (const { region } of copy.regions()) expect(readFileSync(dst.blobPath(region.blob)).equals(readFileSync(src.blobPath(region.blob)))).toBe(true);
      expect((await dst.verify('copy')).ok).toBe(true);
      expect(await restoredEqual(dst, 'copy')).toBe(true);
    }
  }, 60_000);

  it('a raw capture of the same bytes is other layers (the coded layer is named by its own bytes)', async () => {
    const raw = await captured(join(tempDir(), 'r'), 'off');
    const coded = await captured(join(tempDir(), 'c'), 'vsnap-c1');
    await client().push(raw, 'm', `${reg.prefix}/team/raw:v1`);
    await client().push(coded, 'm', `${reg.prefix}/team/coded2:v1`);
    const a = await layersOf(reg, 'team/raw', 'v1');
    const b = await layersOf(reg, 'team/coded2', 'v1');
    expect(a.map((l) => l.mediaType)).toEqual([REGION_MEDIA_TYPE, REGION_MEDIA_TYPE, REGION_MEDIA_TYPE]);
    expect(a[0]!.digest).not.toBe(b[0]!.digest);
    expect(a[2]!.digest).toBe(b[2]!.digest); // random bytes stay raw: the same blob, the same layer
  }, 60_000);

  it('refuses a coded layer damaged in the registry, whole or in parts; nothing of it reaches the store', async () => {
    const src = await captured(join(tempDir(), 's'), 'vsnap-c1', 'c');
    const ref = `${reg.prefix}/team/coded-corrupt:v1`;
    await client().push(src, 'c', ref);
    const region = [...(await src.get('c')).regions()][0]!.region;
    const bytes = readFileSync(src.blobPath(region.blob));
    const sha = createHash('sha256').update(bytes).digest('hex');
    const data = join(reg.storage, 'docker/registry/v2/blobs/sha256', sha.slice(0, 2), sha, 'data');
    const at = codedOffsets(region.codec!)[3]! + 5; // chunk 3's mode
    const fd = openSync(data, 'r+');
    writeSync(fd, Buffer.from([9]), 0, 1, at);
    closeSync(fd);
    const root = join(tempDir(), 'd');
    const dst = await RegionStore.open(root);
    const whole = await rejection(client().pull(dst, ref));
    expect(whole.code).toBe('E_CODEC_CORRUPT');
    expect(whole.message).toContain(`region ${region.key}): chunk 3 is damaged`);
    expect(await dst.list()).toEqual([]);
    expect((await dst.usage()).blobs).toBe(0);
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect((await rejection(client({ rangeMinBytes: 64 * KiB, connections: 2 }).pull(dst, ref))).code).toBe('E_CODEC_CORRUPT');
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
  }, 60_000);
});
