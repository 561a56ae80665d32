import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { OCI_MANIFEST } from '../../src/registry/artifact.js';
import { BODY_LIMITS, OciHttp } from '../../src/registry/http.js';
import { ByteBudget } from '../../src/registry/pool.js';
import { pushManifest, UPLOAD_ATTEMPTS } from '../../src/registry/push.js';
import { parseReference } from '../../src/registry/reference.js';
import { PushState } from '../../src/registry/state.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { blobDigest } from '../../src/manifest/blob-digest.js';
import { RegistryClient } from '../../src/registry/registry.js';
import { RegionStore } from '../../src/store/region-store.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { endless, oversized, serveBlob, servedArtifact, startHostileRegistry, syntheticArtifact, trickle, type HostileRegistry, type Hostile, type Route, type Sent, type ServedArtifact } from '../helpers/hostile-registry.js';
import { patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

// The registry client against a registry written to misbehave (test/helpers/hostile-registry.ts,
// on loopback): every body bounded by what the protocol allows, a 200 to a Range request read as
// the whole blob (streamed), bounded upload retries, stall and trickle deadlines, coded errors
// naming the URL, and open files and chunk buffers bounded whatever the snapshot holds. No test
// depends on timing: a stalled server never sends a byte, a trickling one sends one byte per
// 20 ms against a floor of 1 MiB/s, and the deadlines are small only to keep the tests short.
const MiB = 1024 * 1024;
/** What a bounded client lets an endless writer send before it hangs up: its limit plus socket buffers, far below the writer's 256 MiB cap. */
const HANG_UP_WITHIN = 64 * MiB;

let reg: HostileRegistry | undefined;
afterEach(async () => {
  await reg?.close();
  reg = undefined;
});

async function captured(sizes: Record<string, number>, chunkSize = 256 * 1024): Promise<RegionStore> {
  const store = await RegionStore.open(join(tempDir(), 's'));
  const regions = patternedRegions(sizes);
  try {
    await Snapshot.capture(store, 'm', { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize });
  } finally {
    for (const r of regions.values()) r.close();
  }
  return store;
}

async function errorOf(p: Promise<unknown>): Promise<VsnapError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err, String(err)).toBeInstanceOf(VsnapError);
  return err as VsnapError;
}

const client = (extra: object = {}): RegistryClient => new RegistryClient({ dockerConfig: false, stateDir: join(tempDir(), 'state'), ...extra });

/** Whether a request is for one of the artifact's layers (not its config). */
const layerOf = (artifact: ServedArtifact, route: Route): boolean => route.kind === 'blob' && artifact.blobs.get(route.digest!)?.path !== undefined;

/** A pull of a 1 MiB snapshot from a registry that answers as `hostile` says: its error. */
async function pullFrom(hostile: (artifact: ServedArtifact) => Hostile, options: { registry?: object } = {}): Promise<{ error: VsnapError; store: RegionStore; root: string }> {
  const src = await captured({ w: MiB });
  const artifact = await servedArtifact(src, 'm');
  reg = await startHostileRegistry({ artifact, hostile: hostile(artifact) });
  const root = join(tempDir(), 'd');
  const store = await RegionStore.open(root);
  return { error: await errorOf(client(options.registry).pull(store, reg.reference)), store, root };
}

describe('registry bodies are bounded by what the protocol allows', () => {
  it('an endless manifest is refused past 4 MiB, and the connection closed', async () => {
    let sent: Sent | undefined;
    const { error } = await pullFrom(() => (_req, res, route) => {
      if (route.kind !== 'manifest') return false;
      sent = endless(res, 200, { 'content-type': OCI_MANIFEST });
      return true;
    });
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details.limit).toBe(BODY_LIMITS.manifest);
    expect(error.message).toMatch(/127\.0\.0\.1.*manifest of \d+ bytes or more/);
    await sent!.closed;
    expect(sent!.hungUp).toBe(true);
    expect(sent!.bytes).toBeLessThan(HANG_UP_WITHIN);
  });

  it('a 200 MB manifest is refused from its Content-Length, unread', async () => {
    let sent = 0;
    const { error } = await pullFrom(() => (_req, res, route) => {
      if (route.kind !== 'manifest') return false;
      oversized(res, 200, 200_000_000, { 'content-type': OCI_MANIFEST });
      res.on('close', () => (sent = res.socket?.bytesWritten ?? 0));
      return true;
    });
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details.limit).toBe(BODY_LIMITS.manifest);
    expect(error.message).toMatch(/200000000 bytes/);
    expect(sent).toBeLessThan(HANG_UP_WITHIN);
  });

  it('an endless config blob is refused once it passes its descriptor size', async () => {
    let sent: Sent | undefined;
    const src = await captured({ w: MiB });
    const artifact = await servedArtifact(src, 'm');
    const configDigest = (JSON.parse(artifact.manifest.toString()) as { config: { digest: string; size: number } }).config;
    reg = await startHostileRegistry({
      artifact,
      hostile: (_req, res, route) => {
        if (route.digest !== configDigest.digest) return false;
        sent = endless(res, 200);
        return true;
      },
    });
    const error = await errorOf(client().pull(await RegionStore.open(join(tempDir(), 'd')), reg.reference));
    expect(error.code).toBe('E_CHECKSUM');
    expect(error.message).toMatch(new RegExp(`descriptor says ${configDigest.size}`));
    await sent!.closed;
    expect(sent!.hungUp).toBe(true);
    expect(sent!.bytes).toBeLessThan(HANG_UP_WITHIN);
  });

  it('a 500 with an endless body: E_REGISTRY with the status, only the start of the body read', async () => {
    let sent: Sent | undefined;
    const { error } = await pullFrom(() => (_req, res, route) => {
      if (route.kind !== 'manifest') return false;
      sent = endless(res, 500, { 'content-type': 'text/plain' }, { piece: Buffer.alloc(64 * 1024, 0x61) });
      return true;
    });
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details.status).toBe(500);
    expect(error.message.length).toBeLessThan(2000);
    await sent!.closed;
    expect(sent!.hungUp).toBe(true);
    expect(sent!.bytes).toBeLessThan(HANG_UP_WITHIN);
  });

  it('an endless token answer is refused past 1 MiB', async () => {
    let sent: Sent | undefined;
    const { error } = await pullFrom(() => (req, res, route) => {
      if (req.url?.startsWith('/token')) {
        sent = endless(res, 200, { 'content-type': 'application/json' });
        return true;
      }
      if (route.kind !== 'manifest' || req.headers.authorization) return false;
      res.writeHead(401, { 'www-authenticate': `Bearer realm="${reg!.origin}/token",service="hostile"`, 'content-length': '0' }).end();
      return true;
    });
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details.limit).toBe(BODY_LIMITS.token);
    expect(error.message).toMatch(/token service http:\/\/127\.0\.0\.1/);
    await sent!.closed;
    expect(sent!.hungUp).toBe(true);
    expect(sent!.bytes).toBeLessThan(HANG_UP_WITHIN);
  });

  it('a 200 to a Range request is read as the whole blob, streamed; later blobs come whole', async () => {
    const src = await captured({ a: 4 * MiB, b: 4 * MiB });
    const artifact = await servedArtifact(src, 'm');
    reg = await startHostileRegistry({
      artifact,
      hostile: (_req, res, route) => {
        if (!layerOf(artifact, route)) return false;
        serveBlob(res, artifact.blobs.get(route.digest!)!, route.range, true); // Range ignored: 200 and every byte
        return true;
      },
    });
    const dst = await RegionStore.open(join(tempDir(), 'd'));
    const pulled = await client({ rangeMinBytes: MiB, connections: 2 }).pull(dst, reg.reference);
    expect(pulled.bytesDownloaded).toBe(8 * MiB);
    expect((await dst.verify('m')).ok).toBe(true);
    const layerGets = reg.requests.filter((r) => r.method === 'GET' && layerOf(artifact, r));
    const [first, second] = [...new Set(layerGets.map((r) => r.digest))];
    // the first blob was asked for in two Range parts; once the registry was seen to ignore Range, the second whole
    expect(layerGets.filter((r) => r.digest === first).map((r) => r.range !== undefined)).toEqual([true, true]);
    expect(layerGets.filter((r) => r.digest === second).map((r) => r.range)).toEqual([undefined]);
  });
});

describe('registry uploads', () => {
  it('a registry answering 416 to every PATCH: bounded fresh uploads, then E_REGISTRY 416', async () => {
    const src = await captured({ w: MiB });
    let patches = 0;
    reg = await startHostileRegistry({
      hostile: (req, res, route) => {
        if (route.kind !== 'upload' || req.method !== 'PATCH') return false;
        req.resume();
        // (past 50, a 500 ends a client that would loop forever, so this test fails instead of hanging)
        req.on('end', () => void res.writeHead(++patches > 50 ? 500 : 416, { 'content-length': '0' }).end());
        return true;
      },
    });
    const error = await errorOf(client({ chunkBytes: 256 * 1024 }).push(src, 'm', `${reg.prefix}/team/m:v1`));
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details).toMatchObject({ status: 416, attempts: UPLOAD_ATTEMPTS });
    expect(error.message).toMatch(/416.*127\.0\.0\.1/);
    expect(patches).toBe(UPLOAD_ATTEMPTS);
    expect(reg.requests.filter((r) => r.kind === 'upload' && r.method === 'POST').length).toBe(UPLOAD_ATTEMPTS);
  }, 30_000);

  it('a snapshot whose OCI manifest would pass 4 MiB is refused before anything is hashed or sent', async () => {
    const src = await captured({ w: 4096 }, 4096);
    const data = (await src.get('m')).data;
    // 13,000 distinct one-chunk regions: one layer descriptor each, over 4 MiB of manifest
    const regions = Array.from({ length: 13_000 }, (_, i) => {
      const checksums = [i.toString(16).padStart(32, '0')];
      return { ...data.ranks[0]!.regions[0]!, key: `model.layers.${i}.mlp.down_proj.weight`, checksums, blob: blobDigest(4096, 4096, checksums), tensors: [] };
    });
    const manifest = Manifest.parse({ ...data, ranks: [{ ...data.ranks[0]!, regions }] });
    reg = await startHostileRegistry();
    const http = new OciHttp(parseReference(`${reg.prefix}/team/big:v1`), 'pull,push', { dockerConfig: false });
    const untouched = { withLock: () => Promise.reject(new Error('the store was touched')) } as unknown as RegionStore;
    try {
      const error = await errorOf(pushManifest(untouched, manifest, 'v1', { http, state: new PushState(join(tempDir(), 'state')), chunkBytes: MiB, connections: 4 }));
      expect(error.code).toBe('E_REGISTRY');
      expect(error.details.manifestBytes as number).toBeGreaterThan(BODY_LIMITS.manifest);
      expect(error.message).toMatch(/OCI manifest would be \d+ bytes.*Nothing was sent/);
    } finally {
      await http.close();
    }
    expect(reg.requests).toEqual([]);
  });
});

describe('registry deadlines', () => {
  const small = { timeouts: { stallMs: 300, graceMs: 60_000 } };

  it('a registry that never answers: E_REGISTRY_TIMEOUT (stall) naming the URL', async () => {
    const { error } = await pullFrom(() => (_req, _res, route) => route.kind === 'manifest', { registry: small });
    expect(error.code).toBe('E_REGISTRY_TIMEOUT');
    expect(error.details.reason).toBe('stall');
    expect(error.details.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v2\/team\/m\/manifests\/v1$/);
  });

  it('a layer whose bytes never come: E_REGISTRY_TIMEOUT (stall) naming the layer, nothing kept', async () => {
    const { error, store, root } = await pullFrom(
      (artifact) => (_req, res, route) => {
        if (!layerOf(artifact, route)) return false;
        res.writeHead(200, { 'content-length': String(MiB) });
        res.flushHeaders();
        return true;
      },
      { registry: small },
    );
    expect(error.code).toBe('E_REGISTRY_TIMEOUT');
    expect(error.details.reason).toBe('stall');
    expect(error.details.url).toMatch(/\/v2\/team\/m\/blobs\/sha256:[a-f0-9]{64}$/);
    expect(await store.list()).toEqual([]);
    expect(readdirSync(join(root, 'tmp')).filter((e) => !e.startsWith('.'))).toEqual([]);
  });

  it('a manifest trickled a byte at a time: E_REGISTRY_TIMEOUT (deadline), though bytes keep coming', async () => {
    const { error } = await pullFrom(
      () => (_req, res, route) => {
        if (route.kind !== 'manifest') return false;
        trickle(res, 200, { 'content-type': OCI_MANIFEST });
        return true;
      },
      { registry: { timeouts: { stallMs: 60_000, graceMs: 300, minBytesPerSecond: MiB } } },
    );
    expect(error.code).toBe('E_REGISTRY_TIMEOUT');
    expect(error.details.reason).toBe('deadline');
    expect(error.details.url).toMatch(/\/manifests\/v1$/);
    expect(error.details.bytes as number).toBeGreaterThan(0);
  });

  it('a layer trickled a byte at a time: E_REGISTRY_TIMEOUT (deadline)', async () => {
    const { error } = await pullFrom(
      (artifact) => (_req, res, route) => {
        if (!layerOf(artifact, route)) return false;
        trickle(res, 200, { 'content-length': String(MiB) });
        return true;
      },
      { registry: { timeouts: { stallMs: 60_000, graceMs: 300, minBytesPerSecond: MiB } } },
    );
    expect(error.code).toBe('E_REGISTRY_TIMEOUT');
    expect(error.details.reason).toBe('deadline');
    expect(error.details.url).toMatch(/\/blobs\/sha256:/);
  });
});

describe('registry failures are coded and name the URL', () => {
  it('a bearer realm that is not a URL: E_REGISTRY naming it', async () => {
    const { error } = await pullFrom(() => (_req, res, route) => {
      if (route.kind !== 'manifest') return false;
      res.writeHead(401, { 'www-authenticate': 'Bearer realm="not a url",service="hostile"', 'content-length': '0' }).end();
      return true;
    });
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details.realm).toBe('not a url');
    expect(error.message).toMatch(/realm "not a url".*not an http\(s\) URL/);
  });

  it('a connection reset mid-layer: E_REGISTRY with the layer URL, nothing kept', async () => {
    const { error, store } = await pullFrom((artifact) => (_req, res, route) => {
      if (!layerOf(artifact, route)) return false;
      // the layer's own first 300 KiB (its first chunk checks out), then the connection is cut
      const head = readFileSync(artifact.blobs.get(route.digest!)!.path!).subarray(0, 300 * 1024);
      res.writeHead(200, { 'content-length': String(MiB) });
      res.write(head, () => res.socket?.destroy());
      return true;
    });
    expect(error.code).toBe('E_REGISTRY');
    expect(error.details.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v2\/team\/m\/blobs\/sha256:[a-f0-9]{64}$/);
    expect(error.message).toMatch(/connection .*broke after \d+ bytes of http:\/\/127\.0\.0\.1/);
    expect(await store.list()).toEqual([]);
  });
});

describe('registry pulls hold bounded resources', () => {
  it('300 distinct blobs: blob files are opened as their download starts, not all first', async () => {
    const artifact = syntheticArtifact(await (await captured({ w: 4096 }, 4096)).get('m'), 300);
    const fds = (): number => readdirSync('/proc/self/fd').length;
    let peak = 0;
    reg = await startHostileRegistry({
      artifact,
      hostile: (_req, _res, route) => {
        if (route.kind === 'blob') peak = Math.max(peak, fds()); // sampled as each blob is asked for
        return false;
      },
    });
    const dst = await RegionStore.open(join(tempDir(), 'd'));
    const before = fds();
    await client({ connections: 4 }).pull(dst, reg.reference);
    expect((await dst.verify('m')).ok).toBe(true);
    // sockets of both ends (this process is client and server) and at most 4 blob files
    expect(peak - before).toBeLessThan(40);
  }, 60_000);

  it('chunk buffers: with maxBufferedBytes of one chunk, one part downloads at a time', async () => {
    const src = await captured({ w: 4 * MiB }, MiB);
    const artifact = await servedArtifact(src, 'm');
    let open = 0;
    let peak = 0;
    reg = await startHostileRegistry({
      artifact,
      hostile: (_req, res, route) => {
        if (route.kind !== 'blob' || route.range === undefined) return false;
        peak = Math.max(peak, ++open);
        res.on('close', () => open--);
        return false;
      },
    });
    const dst = await RegionStore.open(join(tempDir(), 'd'));
    await client({ rangeMinBytes: MiB, connections: 4, maxBufferedBytes: MiB }).pull(dst, reg.reference);
    expect((await dst.verify('m')).ok).toBe(true);
    expect(reg.requests.filter((r) => r.range !== undefined).length).toBe(4);
    expect(peak).toBe(1);
  });

  it('ByteBudget grants first come first served, and a request larger than the budget alone', async () => {
    const budget = new ByteBudget(10);
    const order: string[] = [];
    const a = await budget.acquire(6);
    const b = budget.acquire(6).then((r) => (order.push('b'), r));
    const c = budget.acquire(1).then((r) => (order.push('c'), r)); // fits now, but waits its turn
    const big = budget.acquire(50).then((r) => (order.push('big'), r));
    await Promise.resolve();
    expect(order).toEqual([]);
    a();
    (await b)();
    (await c)();
    (await big)();
    expect(order).toEqual(['b', 'c', 'big']);
  });
});
