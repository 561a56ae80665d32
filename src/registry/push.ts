import { createHash } from 'node:crypto';
import { constants, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';

import { abortError, toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import { storedBytes } from '../store/coded-blob.js';
import type { RegionStore } from '../store/region-store.js';
import { buildArtifact, configBlob, CONFIG_MEDIA_TYPE, OCI_MANIFEST, sha256Digest } from './artifact.js';
import { BODY_LIMITS, type OciHttp } from './http.js';
import { runPool } from './pool.js';
import type { PushState } from './state.js';
import type { RegistryProgress } from './types.js';

/** What a push did. @internal */
export interface PushResult {
  readonly digest: string;
  readonly layers: number;
  readonly bytesUploaded: number;
  readonly bytesSkipped: number;
  readonly bytesResumed: number;
}

interface PushJob {
  readonly http: OciHttp;
  readonly state: PushState;
  readonly chunkBytes: number;
  readonly connections: number;
  readonly mountFrom?: string | undefined;
  readonly signal?: AbortSignal | undefined;
  readonly onProgress?: ((p: RegistryProgress) => void) | undefined;
}

const READ = constants.O_RDONLY | constants.O_NOFOLLOW;

/**
 * Pushes one capture: hashes each distinct blob (sha256, cached by store digest), skips the
 * blobs the registry has (HEAD), uploads the rest in parallel (bounded) in PATCH chunks that
 * resume where an interrupted upload stopped, then the config and the manifest. Holds the
 * store's shared blob lock throughout, so gc cannot delete a blob being read.
 * @internal
 */
export async function pushManifest(store: RegionStore, manifest: Manifest, tag: string, job: PushJob): Promise<PushResult> {
  const blobs = new Map<string, number>();
  const coded = new Set<string>();
  for (const { region } of manifest.regions()) {
    blobs.set(region.blob, storedBytes(region));
    if (region.codec) coded.add(region.blob);
  }
  // A raw blob's name fixes its bytes; a coded one's fixes what it decodes to, so its sha256 is remembered for this very file.
  const cacheKey = (blob: string): string | undefined => {
    if (!coded.has(blob)) return blob;
    const st = statSync(store.blobPath(blob), { bigint: true, throwIfNoEntry: false });
    return st ? `${blob}-${st.ino}-${st.mtimeNs}` : undefined; // missing: hashing it says so
  };
  const total = [...blobs.values()].reduce((a, b) => a + b, 0);
  let done = 0;
  const report = (phase: string): void => job.onProgress?.({ phase, bytesDone: done, bytesTotal: total });
  let bytesUploaded = 0;
  let bytesSkipped = 0;
  let bytesResumed = 0;
  refuseUnpullable(manifest, blobs.keys(), job.http.ref.repository);

  return store.withLock(false, async () => {
    // 1. content digests, as OCI names blobs
    const digests = new Map<string, string>();
    const keys = new Map([...blobs.keys()].map((b) => [b, cacheKey(b)])); // before hashing: a blob replaced meanwhile gets a new key
    for (const [blob] of blobs) {
      const key = keys.get(blob);
      const known = key === undefined ? undefined : job.state.contentDigest(key);
      if (known) digests.set(blob, known);
    }
    const toHash = [...blobs].filter(([b]) => !digests.has(b));
    if (toHash.length) {
      done = 0;
      await runPool(toHash, job.connections, async ([blob, size]) => {
        const d = await hashFile(store.blobPath(blob), size, job.signal, (n) => {
          done += n;
          report('hashing');
        });
        const key = keys.get(blob);
        if (key !== undefined) job.state.rememberContentDigest(key, d);
        digests.set(blob, d);
      });
    }

    // 2. layers: skip what the registry has, upload the rest
    done = 0;
    report('uploading');
    await runPool([...blobs], job.connections, async ([blob, size]) => {
      const digest = digests.get(blob)!;
      if (await hasBlob(job, digest)) {
        // (an upload finished by a push killed before it forgot the upload leaves its record)
        job.state.forgetUpload(job.http.base.origin, job.http.ref.repository, digest);
        bytesSkipped += size;
        done += size;
        report('uploading');
        return;
      }
      // one buffer per blob, reused by every PATCH (each is sent before the next is read)
      const buf = Buffer.allocUnsafe(Math.min(job.chunkBytes, size));
      const r = await uploadBlob(job, digest, size, async (offset, length) => readAt(store.blobPath(blob), offset, buf.subarray(0, length)), (n) => {
        done += n;
        report('uploading');
      });
      bytesUploaded += r.sent;
      if (r.mounted) bytesSkipped += size;
      else bytesResumed += r.resumedAt;
      done += r.mounted ? size : r.resumedAt;
      report('uploading');
    });

    // 3. the config (the vsnap manifest), then the OCI manifest under the tag
    const config = configBlob(manifest);
    const artifact = buildArtifact(manifest, config, digests);
    if (!(await hasBlob(job, artifact.config.digest))) {
      await uploadBlob(job, artifact.config.digest, config.length, async (o, n) => config.subarray(o, o + n), () => undefined);
    }
    const body = Buffer.from(JSON.stringify(artifact));
    await job.http.send('PUT', job.http.repoPath(`manifests/${tag}`), {
      headers: { 'content-type': OCI_MANIFEST },
      body,
      ok: [201],
      signal: job.signal,
      what: `push ${manifest.name} as ${job.http.ref.repository}:${tag}`,
    }).then((r) => r.body.dump());
    report('done');
    return { digest: sha256Digest(body), layers: artifact.layers.length, bytesUploaded, bytesSkipped, bytesResumed };
  });
}

/**
 * Refuses, before anything is hashed or sent, a snapshot whose OCI manifest or config would be
 * over the sizes a pull accepts (BODY_LIMITS): the CNCF distribution registry refuses a manifest
 * over 4 MiB only at the final PUT, after every layer was uploaded.
 */
function refuseUnpullable(manifest: Manifest, blobs: Iterable<string>, repository: string): void {
  const config = configBlob(manifest);
  const placeholder = `sha256:${'0'.repeat(64)}`; // a digest's length: the manifest's size is exact
  const size = Buffer.byteLength(JSON.stringify(buildArtifact(manifest, config, new Map([...blobs].map((b) => [b, placeholder])))));
  if (size > BODY_LIMITS.manifest || config.length > BODY_LIMITS.config) {
    const which =
      size > BODY_LIMITS.manifest
        ? `its OCI manifest would be ${size} bytes (one layer per distinct region blob), over the ${BODY_LIMITS.manifest} registries accept; it has too many regions for one artifact`
        : `its config (the vsnap manifest) would be ${config.length} bytes, over the ${BODY_LIMITS.config} a pull accepts; capture it with a larger chunkSize (fewer checksums)`;
    throw new VsnapError('E_REGISTRY', `push ${manifest.name} to ${repository}: ${which}. Nothing was sent.`, { manifestBytes: size, configBytes: config.length });
  }
}

/** HEAD /v2/<name>/blobs/<digest>: 200 when the registry has it. */
async function hasBlob(job: PushJob, digest: string): Promise<boolean> {
  const res = await job.http.send('HEAD', job.http.repoPath(`blobs/${digest}`), { ok: [200, 404], signal: job.signal, what: `check blob ${digest}` });
  await res.body.dump();
  return res.status === 200;
}

/** Fresh uploads of one blob tried before a registry that answers 416 to each is given up on. */
export const UPLOAD_ATTEMPTS = 4;
/** The wait before the second attempt; doubled before each one after. */
const UPLOAD_BACKOFF_MS = 250;

/**
 * Uploads one blob: resumes a saved upload, else mounts it or opens a new one, and PATCHes it
 * (see {@link uploadOnce}). A 416 to a PATCH means the registry's upload state disagrees with
 * vsnap's: the upload is forgotten and the blob started over, up to UPLOAD_ATTEMPTS times with a
 * doubling wait between them; then E_REGISTRY (status 416), never a loop.
 */
async function uploadBlob(job: PushJob, digest: string, size: number, read: (offset: number, length: number) => Promise<Buffer>, sent: (n: number) => void): Promise<{ sent: number; resumedAt: number; mounted?: boolean }> {
  const { http, state } = job;
  for (let attempt = 1; ; attempt++) {
    const r = await uploadOnce(job, digest, size, read, sent);
    if (r.kind === 'done') return r.result;
    state.forgetUpload(http.base.origin, http.ref.repository, digest);
    if (attempt >= UPLOAD_ATTEMPTS) {
      throw new VsnapError(
        'E_REGISTRY',
        `upload blob ${digest}: the registry answered 416 (Range Not Satisfiable) to a PATCH of ${attempt} uploads in a row, the last at bytes ${r.range} of ${r.url}; its upload state disagrees with the bytes sent. Nothing more is sent; check the registry (or a proxy in front of it that rewrites Content-Range), then push again.`,
        { status: 416, url: r.url, attempts: attempt },
      );
    }
    if (job.signal?.aborted) throw abortError(job.signal, 'the push');
    await sleep(UPLOAD_BACKOFF_MS * 2 ** (attempt - 1), undefined, job.signal ? { signal: job.signal } : {}).catch(() => {
      throw abortError(job.signal, 'the push');
    });
  }
}

type UploadOutcome = { kind: 'done'; result: { sent: number; resumedAt: number; mounted?: boolean } } | { kind: 'restart'; url: string; range: string };

/**
 * One upload of a blob: resumes a saved upload (GET its status: `Range: 0-<last>`), else mounts
 * it from `mountFrom` or opens a new one (POST); then PATCHes chunks with Content-Range, saving
 * the new Location after each (the registry may encode its state there), and closes with
 * PUT ?digest=. Returns the bytes sent and the offset it resumed at, or `restart` on a 416.
 */
async function uploadOnce(job: PushJob, digest: string, size: number, read: (offset: number, length: number) => Promise<Buffer>, sent: (n: number) => void): Promise<UploadOutcome> {
  const { http, state } = job;
  const origin = http.base.origin;
  const repo = http.ref.repository;
  const what = `upload blob ${digest}`;
  let location: string | undefined;
  let offset = 0;
  const saved = state.upload(origin, repo, digest);
  if (saved) {
    const status = await http.send('GET', saved, { ok: [204, 400, 404, 416], signal: job.signal, what }).catch(() => undefined);
    if (status) await status.body.dump();
    if (status?.status === 204) {
      const range = /^(?:bytes=)?0-(\d+)$/.exec(String(status.headers.range ?? ''));
      offset = range ? Number(range[1]) + 1 : 0;
      if (offset === 1) offset = 0; // "0-0" is how some registries say "nothing yet"; a wrong guess costs a restart below
      location = String(status.headers.location ?? saved);
      if (offset > size) offset = 0;
    }
  }
  const resumedAt = offset;
  if (!location) {
    offset = 0;
    const mount = job.mountFrom ? `?mount=${encodeURIComponent(digest)}&from=${encodeURIComponent(job.mountFrom)}` : '';
    const res = await http.send('POST', http.repoPath(`blobs/uploads/${mount}`), { headers: { 'content-length': '0' }, ok: [201, 202], signal: job.signal, what });
    await res.body.dump();
    if (res.status === 201) return { kind: 'done', result: { sent: 0, resumedAt: 0, mounted: true } };
    location = locationOf(res, what);
    state.rememberUpload(origin, repo, digest, location);
  }
  let bytes = 0;
  while (offset < size) {
    if (job.signal?.aborted) throw abortError(job.signal, 'the push');
    const n = Math.min(job.chunkBytes, size - offset);
    const chunk = await read(offset, n);
    const range = `${offset}-${offset + n - 1}`;
    const res = await http.send('PATCH', location, {
      headers: { 'content-type': 'application/octet-stream', 'content-range': range, 'content-length': String(n) },
      body: chunk,
      ok: [202, 416],
      signal: job.signal,
      what,
    });
    await res.body.dump();
    if (res.status === 416) return { kind: 'restart', url: `${res.url.origin}${res.url.pathname}`, range };
    location = locationOf(res, what);
    state.rememberUpload(origin, repo, digest, location);
    offset += n;
    bytes += n;
    sent(n);
  }
  const close = new URL(location, http.base);
  close.searchParams.set('digest', digest);
  const res = await http.send('PUT', close, { headers: { 'content-length': '0' }, ok: [201], signal: job.signal, what });
  await res.body.dump();
  state.forgetUpload(origin, repo, digest);
  return { kind: 'done', result: { sent: bytes, resumedAt } };
}

function locationOf(res: { headers: Record<string, string | string[] | undefined>; url: URL }, what: string): string {
  const loc = res.headers.location;
  const value = Array.isArray(loc) ? loc[0] : loc;
  if (!value) throw new VsnapError('E_REGISTRY', `${what}: the registry answered without a Location header`, { url: res.url.href });
  return new URL(value, res.url).href;
}

async function readAt(path: string, offset: number, buf: Buffer): Promise<Buffer> {
  const length = buf.length;
  const handle = await open(path, READ);
  try {
    let got = 0;
    while (got < length) {
      const { bytesRead } = await handle.read(buf, got, length - got, offset + got);
      if (bytesRead === 0) throw new VsnapError('E_BLOB_TRUNCATED', `${path} ends at ${offset + got}; expected ${offset + length} bytes or more. Run \`vsnap verify\`.`, { path });
      got += bytesRead;
    }
    return buf;
  } catch (err) {
    throw toVsnapError(err);
  } finally {
    await handle.close();
  }
}

/** sha256 of a store blob, read in 8 MiB pieces. */
export async function hashFile(path: string, size: number, signal: AbortSignal | undefined, progress: (n: number) => void): Promise<string> {
  const handle = await open(path, READ).catch((err: unknown) => {
    throw toVsnapError(err);
  });
  try {
    const h = createHash('sha256');
    const buf = Buffer.allocUnsafe(8 * 1024 * 1024);
    let offset = 0;
    for (;;) {
      if (signal?.aborted) throw abortError(signal, 'hashing');
      const { bytesRead } = await handle.read(buf, 0, buf.length, offset);
      if (bytesRead === 0) break;
      h.update(buf.subarray(0, bytesRead));
      offset += bytesRead;
      progress(bytesRead);
    }
    if (offset !== size) throw new VsnapError('E_BLOB_TRUNCATED', `${path} holds ${offset} bytes; its manifest says ${size}. Run \`vsnap verify\`.`, { path });
    return `sha256:${h.digest('hex')}`;
  } finally {
    await handle.close();
  }
}

export { CONFIG_MEDIA_TYPE };
