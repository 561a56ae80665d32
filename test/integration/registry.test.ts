import { readdirSync, readFileSync, statSync, writeFileSync, openSync, writeSync, closeSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { RegistryClient } from '../../src/registry/registry.js';
import { RegionStore } from '../../src/store/region-store.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { VsnapError } from '../../src/errors.js';
import { patternedRegions } from '../helpers/regions.js';
import { registryAvailable, startRegistry, type TestRegistry } from '../helpers/registry.js';
import { tempDir } from '../helpers/tmp.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';

// Snapshots pushed to and pulled from the real CNCF distribution registry (Debian's
// docker-registry), on loopback, with TLS and htpasswd (bcrypt) auth, anonymous, and bearer
// tokens from a JWT token server; real store, real native checksums.
const MiB = 1024 * 1024;
const run = registryAvailable();
const user = { name: 'alice', password: 'wonderland' };

async function captured(root: string, sizes: Record<string, number> = { 'layers.0.weight': 3 * MiB + 4096, 'layers.1.weight': MiB, empty: 0 }, name = 'm'): Promise<RegionStore> {
  const store = await RegionStore.open(root);
  const regions = patternedRegions(sizes);
  try {
    await Snapshot.capture(store, name, { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize: 256 * 1024 });
  } finally {
    for (const r of regions.values()) r.close();
  }
  return store;
}

function blobBytes(store: RegionStore, digest: string): Buffer {
  return readFileSync(store.blobPath(digest));
}

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'resolved';
  } catch (err) {
    if (!(err instanceof VsnapError)) throw err;
    return err.code;
  }
}

describe.skipIf(!run)('registry: TLS + htpasswd', () => {
  let reg: TestRegistry;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'vsnap-reg-'));
    reg = await startRegistry(dir, { tls: true, auth: 'htpasswd', user });
  }, 30_000);
  afterAll(async () => {
    await reg?.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const client = (extra: object = {}) => new RegistryClient({ ca: reg.ca!, credentials: { username: user.name, password: user.password }, stateDir: join(dir, 'state'), chunkBytes: 256 * 1024, dockerConfig: false, ...extra });

  it('pushes, pulls into another store (renamed, over Range requests), and a second push sends nothing', async () => {
    const src = await captured(join(tempDir(), 's'));
    const ref = `${reg.host}/team/model:v1`;
    const first = await client().push(src, 'm', ref);
    expect(first.layers).toBe(3);
    expect(first.bytesUploaded).toBe(4 * MiB + 4096);
    await reg.mark();
    const again = await client().push(src, 'm', ref);
    expect(again.bytesUploaded).toBe(0);
    expect(again.bytesSkipped).toBe(4 * MiB + 4096);
    expect(again.digest).toBe(first.digest);
    expect((await reg.mark()).filter((r) => r.method === 'PATCH' || r.method === 'POST')).toEqual([]);

    const dst = await RegionStore.open(join(tempDir(), 'd'));
    await reg.mark();
    const pulled = await client({ rangeMinBytes: MiB, connections: 3 }).pull(dst, ref, { name: 'copy' });
    expect(pulled).toMatchObject({ name: 'copy', digest: first.digest, bytesDownloaded: 4 * MiB + 4096, bytesSkipped: 0 });
    const blobGets = (await reg.mark()).filter((r) => r.method === 'GET' && r.path.includes('/blobs/'));
    expect(blobGets.length).toBeGreaterThan(4); // config + the 3 MiB blob in parts + the others
    const a = await src.get('m');
    const b = await dst.get('copy');
    expect(b.id).toBe(a.id);
    expect(b.data.ranks).toEqual(a.data.ranks);
    for (const { region } of a.regions()) expect(blobBytes(dst, region.blob).equals(blobBytes(src, region.blob))).toBe(true);
    expect((await dst.verify('copy')).ok).toBe(true);
    // pulling again downloads nothing
    const again2 = await client().pull(dst, ref, { name: 'copy' });
    expect(again2.bytesDownloaded).toBe(0);
    // another repository of the same registry: the blobs are mounted, not sent
    await reg.mark();
    const mounted = await client().push(src, 'm', `${reg.host}/other/model:v1`, { mountFrom: 'team/model' });
    expect(mounted).toMatchObject({ bytesUploaded: 0, bytesSkipped: 4 * MiB + 4096, bytesResumed: 0 });
    const log = (await reg.mark()).filter((r) => r.status !== 401);
    expect(log.filter((r) => r.method === 'POST' && r.path.includes('mount=sha256') && r.status === 201).length).toBe(3 + 1); // the layers and the config
    expect(log.filter((r) => r.method === 'PATCH')).toEqual([]);
  }, 30_000);

  it('resumes an interrupted push: only the bytes the registry lacks are sent again', async () => {
    const src = await captured(join(tempDir(), 's'), { big: 4 * MiB }, 'r');
    const ref = `${reg.host}/team/resume:v1`;
    const abort = new AbortController();
    const c = client({ connections: 1 });
    const interrupted = c.push(src, 'r', ref, {
      signal: abort.signal,
      onProgress: (p) => {
        if (p.phase === 'uploading' && p.bytesDone >= 1.5 * MiB) abort.abort();
      },
    });
    expect(await code(interrupted)).toBe('E_ABORTED');
    await reg.mark();
    const resumed = await client({ connections: 1 }).push(src, 'r', ref);
    expect(resumed.bytesResumed).toBe(1.5 * MiB);
    expect(resumed.bytesUploaded).toBe(2.5 * MiB);
    // (a fresh client's first request is answered 401, then sent again with credentials: not counted)
    const patches = (await reg.mark()).filter((r) => r.method === 'PATCH' && r.status !== 401);
    expect(patches.length).toBe(10 + 1); // the 2.5 MiB left in 256 KiB chunks, and the config
    const dst = await RegionStore.open(join(tempDir(), 'd'));
    await client().pull(dst, ref);
    expect((await dst.verify('r')).ok).toBe(true);
  }, 30_000);

  it('refuses an incompatible snapshot from its config, before any layer is fetched', async () => {
    const src = await captured(join(tempDir(), 's'), undefined, 'x');
    const ref = `${reg.host}/team/incompat:v1`;
    await client().push(src, 'x', ref);
    const layers = [...(await src.get('x')).regions()].map(({ region }) => region);
    const dst = await RegionStore.open(join(tempDir(), 'd'));
    await reg.mark();
    const err = await client().pull(dst, ref, { live: { platform: { kind: 'cuda', gpuName: 'NVIDIA H200' }, ranks: [{ regions: [{ key: 'layers.0.weight', size: 1 }] }] } }).catch((e: VsnapError) => e);
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).code).toBe('E_MANIFEST_MISMATCH');
    const mismatches = (err as VsnapError).details.mismatches as Array<{ path: string }>;
    expect(mismatches.map((m) => m.path).sort()).toEqual(
      ['platform.gpuName', 'platform.kind', 'ranks[0].regions["empty"]', 'ranks[0].regions["layers.0.weight"].size', 'ranks[0].regions["layers.1.weight"]'].sort(),
    );
    const gets = (await reg.mark()).filter((r) => r.method === 'GET' && r.status !== 401);
    expect(gets.length).toBe(2); // the manifest and the config, nothing else
    expect(gets[0]!.path).toContain('/manifests/v1');
    expect(layers.length).toBe(3);
    expect(await dst.list()).toEqual([]);
  }, 30_000);

  it('refuses a layer corrupted in the registry; nothing of it reaches the store', async () => {
    const src = await captured(join(tempDir(), 's'), { w: 2 * MiB }, 'c');
    const ref = `${reg.host}/team/corrupt:v1`;
    await client().push(src, 'c', ref);
    const blob = [...(await src.get('c')).regions()][0]!.region.blob;
    const sha = (await import('node:crypto')).createHash('sha256').update(blobBytes(src, blob)).digest('hex');
    const data = join(reg.storage, 'docker/registry/v2/blobs/sha256', sha.slice(0, 2), sha, 'data');
    const fd = openSync(data, 'r+');
    writeSync(fd, Buffer.from([0xff ^ blobBytes(src, blob)[MiB + 7]!]), 0, 1, MiB + 7);
    closeSync(fd);
    const root = join(tempDir(), 'd');
    const dst = await RegionStore.open(root);
    expect(await code(client().pull(dst, ref))).toBe('E_CHECKSUM');
    expect(await dst.list()).toEqual([]);
    expect((await dst.usage()).blobs).toBe(0);
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    // split into Range parts too: the damaged part is refused the same way
    expect(await code(client({ rangeMinBytes: 512 * 1024 }).pull(dst, ref))).toBe('E_CHECKSUM');
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
  }, 30_000);

  it('a pull cancelled midway leaves nothing in the store and no descriptor open', async () => {
    const src = await captured(join(tempDir(), 's'), { w: 4 * MiB }, 'p');
    const ref = `${reg.host}/team/cancel:v1`;
    await client().push(src, 'p', ref);
    const root = join(tempDir(), 'd');
    const dst = await RegionStore.open(root);
    const fds = readdirSync('/proc/self/fd').length;
    const abort = new AbortController();
    const pulling = client({ rangeMinBytes: MiB, connections: 2 }).pull(dst, ref, {
      signal: abort.signal,
      onProgress: (p) => {
        if (p.phase === 'downloading' && p.bytesDone >= MiB) abort.abort();
      },
    });
    expect(await code(pulling)).toBe('E_ABORTED');
    expect(await dst.list()).toEqual([]);
    expect((await dst.usage()).blobs).toBe(0);
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect(readdirSync('/proc/self/fd').length).toBeLessThanOrEqual(fds); // (a socket of earlier work may close meanwhile)
  }, 30_000);

  it('bad or missing credentials and an untrusted CA fail with clear errors; Docker config credentials work', async () => {
    const src = await captured(join(tempDir(), 's'), { w: MiB }, 'a');
    const ref = `${reg.host}/team/auth:v1`;
    const wrong = client({ credentials: { username: 'alice', password: 'nope' } }).push(src, 'a', ref);
    const e1 = await wrong.catch((e: VsnapError) => e);
    expect((e1 as VsnapError).code).toBe('E_REGISTRY_AUTH');
    expect((e1 as VsnapError).message).toMatch(/credentials/);
    const none = new RegistryClient({ ca: reg.ca!, dockerConfig: false, stateDir: join(dir, 'state') });
    const e2 = await none.push(src, 'a', ref).catch((e: VsnapError) => e);
    expect((e2 as VsnapError).code).toBe('E_REGISTRY_AUTH');
    expect((e2 as VsnapError).message).toMatch(/docker login/);
    const noCa = new RegistryClient({ credentials: { username: user.name, password: user.password }, dockerConfig: false, stateDir: join(dir, 'state') });
    const e3 = await noCa.push(src, 'a', ref).catch((e: VsnapError) => e);
    expect((e3 as VsnapError).code).toBe('E_REGISTRY');
    expect((e3 as VsnapError).message).toMatch(/CA/);

    const docker = tempDir();
    writeFileSync(join(docker, 'config.json'), JSON.stringify({ auths: { [reg.host]: { auth: Buffer.from(`${user.name}:${user.password}`).toString('base64') } } }));
    const saved = process.env.DOCKER_CONFIG;
    process.env.DOCKER_CONFIG = docker;
    try {
      const r = await new RegistryClient({ ca: reg.ca!, stateDir: join(dir, 'state') }).push(src, 'a', ref);
      expect(r.layers).toBe(1);
    } finally {
      if (saved === undefined) delete process.env.DOCKER_CONFIG;
      else process.env.DOCKER_CONFIG = saved;
    }
  }, 30_000);
});

describe.skipIf(!run)('registry: anonymous, plain HTTP', () => {
  it('pushes and pulls without any credentials', async () => {
    const dir = tempDir();
    const reg = await startRegistry(dir, {});
    try {
      const src = await captured(join(dir, 's'));
      const r = new RegistryClient({ dockerConfig: false, stateDir: join(dir, 'state') });
      await r.push(src, 'm', `${reg.prefix}/open/model:latest`);
      const dst = await RegionStore.open(join(dir, 'd'));
      const pulled = await r.pull(dst, `${reg.prefix}/open/model`);
      expect(pulled.name).toBe('m');
      expect((await dst.verify('m')).ok).toBe(true);
      expect((await r.inspect(`${reg.prefix}/open/model@${pulled.digest}`)).manifest.id).toBe((await src.get('m')).id);
      // a registry reference as a snapshot source: pulled on first use, then local (no request)
      const snap = await r.openSnapshot(dst, `${reg.prefix}/open/model:latest`);
      expect(snap.name).toBe('model-latest');
      expect(snap.manifest.id).toBe((await src.get('m')).id);
      await reg.mark();
      const again = await r.openSnapshot(dst, `${reg.prefix}/open/model:latest`);
      expect(again.manifest.id).toBe(snap.manifest.id);
      expect(await reg.mark()).toEqual([]);
    } finally {
      await reg.close();
    }
  }, 30_000);
});

describe.skipIf(!run)('registry: bearer tokens (auth: token, a JWT token server)', () => {
  it.each(['token', 'access_token'] as const)('push and pull through the token flow (%s)', async (field) => {
    const dir = tempDir();
    const reg = await startRegistry(dir, { auth: 'token', user, tokenField: field });
    try {
      const src = await captured(join(dir, 's'), { w: MiB }, 'b');
      const r = new RegistryClient({ credentials: { username: user.name, password: user.password }, dockerConfig: false, stateDir: join(dir, 'state') });
      await r.push(src, 'b', `${reg.prefix}/tok/model:v1`);
      const dst = await RegionStore.open(join(dir, 'd'));
      await r.pull(dst, `${reg.prefix}/tok/model:v1`);
      expect((await dst.verify('b')).ok).toBe(true);
      const scopes = reg.tokenRequests.map((u) => u.searchParams.get('scope'));
      expect(scopes).toContain('repository:tok/model:pull,push');
      expect(scopes).toContain('repository:tok/model:pull');
      expect(reg.tokenRequests.every((u) => u.searchParams.get('service') === 'vsnap-test')).toBe(true);
      const bad = new RegistryClient({ credentials: { username: user.name, password: 'x' }, dockerConfig: false, stateDir: join(dir, 'state') });
      const e = await bad.pull(dst, `${reg.prefix}/tok/model:v1`).catch((x: VsnapError) => x);
      expect((e as VsnapError).code).toBe('E_REGISTRY_AUTH');
    } finally {
      await reg.close();
    }
  }, 30_000);
});

void statSync;
