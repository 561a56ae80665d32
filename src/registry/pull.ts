import { createHash, type Hash } from 'node:crypto';
import { lstatSync } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';

import { abortError, toVsnapError, VsnapError } from '../errors.js';
import { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import { native } from '../native/index.js';
import { blobDigest } from '../manifest/blob-digest.js';
import type { RegionStore } from '../store/region-store.js';
import { ANNOTATION, OCI_MANIFEST, parseArtifact, sha256Digest, type Descriptor, type SnapshotArtifact } from './artifact.js';
import type { OciHttp } from './http.js';
import { runPool } from './pool.js';
import { formatReference } from './reference.js';
import type { PullCompatibility, RegistryProgress } from './types.js';

/** The largest config accepted (a manifest of many regions is a few MiB). */
const MAX_CONFIG = 64 * 1024 * 1024;

/** A snapshot's OCI manifest and vsnap manifest, fetched without any layer. @internal */
export interface ResolvedArtifact {
  readonly digest: string;
  readonly artifact: SnapshotArtifact;
  readonly manifest: Manifest;
}

/** GETs the OCI manifest and the config blob (nothing else), checking both digests. @internal */
export async function resolveArtifact(http: OciHttp, signal: AbortSignal | undefined): Promise<ResolvedArtifact> {
  const where = formatReference(http.ref);
  const res = await http.send('GET', http.repoPath(`manifests/${http.ref.reference}`), { headers: { accept: OCI_MANIFEST }, ok: [200], signal, what: `pull ${where}` });
  const text = await res.body.text();
  const digest = sha256Digest(text);
  if (http.ref.reference.startsWith('sha256:') && digest !== http.ref.reference) {
    throw new VsnapError('E_CHECKSUM', `${where}: the registry sent a manifest whose digest is ${digest}; refusing it`, { reference: where, digest });
  }
  const artifact = parseArtifact(text, where);
  if (artifact.config.size > MAX_CONFIG) throw new VsnapError('E_REGISTRY', `${where}: config of ${artifact.config.size} bytes is too large for a vsnap manifest`, { reference: where });
  const cres = await http.send('GET', http.repoPath(`blobs/${artifact.config.digest}`), { ok: [200], signal, what: `pull the config of ${where}` });
  const config = Buffer.from(await cres.body.arrayBuffer());
  if (config.length !== artifact.config.size || sha256Digest(config) !== artifact.config.digest) {
    throw new VsnapError('E_CHECKSUM', `${where}: the config blob does not match its digest ${artifact.config.digest}; refusing it`, { reference: where });
  }
  return { digest, artifact, manifest: Manifest.parse(config.toString('utf8'), `the config of ${where}`) };
}

/** Refuses a snapshot that does not fit `live` (every difference listed), before any layer is fetched. @internal */
export function checkCompatible(manifest: Manifest, live: PullCompatibility): void {
  // Facts only when no ranks are given: the snapshot's own layout stands in for the live one.
  const ranks = live.ranks ?? manifest.data.ranks.map((r) => ({ regions: r.regions.map((x) => ({ key: x.key, size: x.size })) }));
  manifest.assertCompatible({ ...live, ranks });
}

interface BlobPlan {
  readonly region: RegionInfo;
  readonly layer: Descriptor;
  readonly index: number;
}

/** Every distinct region blob with its layer, each checked against the config. @internal */
export function planLayers(resolved: ResolvedArtifact, where: string): BlobPlan[] {
  const byBlob = new Map<string, Descriptor>();
  for (const layer of resolved.artifact.layers) {
    const blob = layer.annotations?.[ANNOTATION.blob];
    if (blob) byBlob.set(blob, layer);
  }
  const plans: BlobPlan[] = [];
  const seen = new Set<string>();
  for (const { region } of resolved.manifest.regions()) {
    if (seen.has(region.blob)) continue;
    seen.add(region.blob);
    const layer = byBlob.get(region.blob);
    const bad = (why: string): never => {
      throw new VsnapError('E_MANIFEST_INVALID', `${where}: region ${region.key} ${why}; the artifact is damaged or was not written by vsnap push`, {
        reference: where,
        issues: [{ path: region.key, message: why }],
      });
    };
    if (!layer) bad(`(blob ${region.blob}) has no layer`);
    if (layer!.size !== region.size) bad(`is ${region.size} bytes in the config, its layer ${layer!.size}`);
    // the store names blobs by their chunk checksums: a config whose names and checksums disagree is refused
    if (blobDigest(region.size, region.chunkSize, region.checksums) !== region.blob) bad('names a blob its checksums do not give');
    plans.push({ region, layer: layer!, index: plans.length });
  }
  return plans;
}

interface PullJob {
  readonly http: OciHttp;
  readonly connections: number;
  readonly rangeMinBytes: number;
  readonly signal?: AbortSignal | undefined;
  readonly onProgress?: ((p: RegistryProgress) => void) | undefined;
}

/**
 * Downloads the blobs the store lacks into a capture transaction of the store (its tmp
 * directory, its locks, its crash-safe publish), each chunk checked against its xxh3 checksum
 * as it arrives and each blob against its sha256, then publishes the manifest under `name`.
 * Anything damaged throws before the publish, and the transaction's files are removed.
 * @internal
 */
export async function pullInto(store: RegionStore, resolved: ResolvedArtifact, name: string, job: PullJob): Promise<{ manifest: Manifest; bytesDownloaded: number; bytesSkipped: number }> {
  const where = formatReference(job.http.ref);
  const manifest = name === resolved.manifest.name ? resolved.manifest : Manifest.parse({ ...resolved.manifest.data, name });
  const plans = planLayers(resolved, where);
  const missing = plans.filter((p) => !lstatSync(store.blobPath(p.region.blob), { throwIfNoEntry: false })?.isFile());
  const bytesDownloaded = missing.reduce((n, p) => n + p.region.size, 0);
  const bytesSkipped = plans.reduce((n, p) => n + p.region.size, 0) - bytesDownloaded;
  const txn = await store.beginCapture(name, bytesDownloaded, manifest.id);
  try {
    let done = 0;
    const progress = (n: number): void => {
      done += n;
      job.onProgress?.({ phase: 'downloading', bytesDone: done, bytesTotal: bytesDownloaded });
    };
    // one task per blob, or per part of a large blob (parts aligned to its chunk size)
    const tasks: Array<{ plan: BlobPlan; start: number; end: number; handle: FileHandle; hash?: Hash }> = [];
    const handles: FileHandle[] = [];
    try {
      for (const plan of missing) {
        const handle = await open(txn.blobTmpPath(plan.index), 'wx+', 0o644);
        handles.push(handle);
        const { size, chunkSize } = plan.region;
        const parts = size >= job.rangeMinBytes ? Math.min(job.connections, Math.ceil(size / chunkSize)) : 1;
        if (parts === 1) {
          tasks.push({ plan, start: 0, end: size, handle, hash: createHash('sha256') });
          continue;
        }
        const per = Math.ceil(size / chunkSize / parts) * chunkSize;
        for (let start = 0; start < size; start += per) tasks.push({ plan, start, end: Math.min(size, start + per), handle });
      }
      await runPool(tasks, job.connections, (t) => fetchPart(job, t.plan, t.start, t.end, t.handle, t.hash, progress));
      // sha256 of blobs fetched in parts: over the written file (the chunks were checked on arrival)
      for (const plan of missing) {
        const whole = tasks.find((t) => t.plan === plan && t.hash);
        const digest = whole ? `sha256:${whole.hash!.digest('hex')}` : await fileSha256(handles[missing.indexOf(plan)]!, plan.region.size, job.signal);
        if (digest !== plan.layer.digest) {
          throw new VsnapError('E_CHECKSUM', `${where}: layer ${plan.layer.digest} (region ${plan.region.key}) arrived with sha256 ${digest}; nothing of it was stored`, { reference: where, region: plan.region.key });
        }
      }
      for (const h of handles) await h.sync();
    } finally {
      for (const h of handles) await h.close().catch(() => undefined);
    }
    job.onProgress?.({ phase: 'publishing', bytesDone: done, bytesTotal: bytesDownloaded });
    const missingSet = new Set(missing);
    await txn.publish(
      manifest,
      plans.map((p) => ({ ...(missingSet.has(p) ? { tmpPath: txn.blobTmpPath(p.index) } : {}), digest: p.region.blob, size: p.region.size })),
    );
    return { manifest, bytesDownloaded, bytesSkipped };
  } catch (err) {
    await txn.abort();
    // a cancelled request fails inside undici with its own error: reported as the cancellation
    if (job.signal?.aborted) throw abortError(job.signal, 'the pull');
    throw toVsnapError(err);
  }
}

/** GETs bytes [start, end) of a layer (a Range request unless it is the whole blob), checking each chunk as it completes. */
async function fetchPart(job: PullJob, plan: BlobPlan, start: number, end: number, handle: FileHandle, hash: Hash | undefined, progress: (n: number) => void): Promise<void> {
  const { region, layer } = plan;
  const whole = start === 0 && end === region.size;
  const res = await job.http.send('GET', job.http.repoPath(`blobs/${layer.digest}`), {
    headers: whole ? {} : { range: `bytes=${start}-${end - 1}` },
    ok: whole ? [200] : [206],
    signal: job.signal,
    what: `download layer ${layer.digest}`,
  });
  // One chunk buffer per part, filled in place: a fresh buffer per chunk costs a page fault per
  // 4 KiB, which halved the rate on the machines measured.
  const buf = Buffer.allocUnsafe(Math.min(region.chunkSize, end - start));
  let pos = start;
  let filled = 0;
  let extra = 0;
  try {
    for await (const data of res.body as AsyncIterable<Buffer>) {
      if (job.signal?.aborted) throw abortError(job.signal, 'the pull');
      job.http.counters.bytesReceived += data.length;
      progress(data.length);
      let off = 0;
      while (off < data.length) {
        const want = Math.min(region.chunkSize, end - pos);
        if (want === 0) {
          extra += data.length - off; // more than asked for
          break;
        }
        const n = Math.min(want - filled, data.length - off);
        data.copy(buf, filled, off, off + n);
        filled += n;
        off += n;
        if (filled === want) {
          await storeChunk(buf.subarray(0, want));
          filled = 0;
        }
      }
      if (extra > 0) break;
    }
  } finally {
    await res.body.dump().catch(() => undefined);
  }
  if (pos !== end || filled !== 0 || extra !== 0) {
    throw new VsnapError('E_BLOB_TRUNCATED', `layer ${layer.digest} (region ${region.key}): expected bytes ${start}-${end - 1}, the registry sent ${pos - start + filled + extra}; nothing of it was stored`, { region: region.key });
  }

  async function storeChunk(chunk: Buffer): Promise<void> {
    const index = pos / region.chunkSize;
    if (native().checksum(chunk) !== region.checksums[index]) {
      throw new VsnapError('E_CHECKSUM', `layer ${layer.digest} (region ${region.key}): chunk ${index} does not match its checksum; the registry's copy is damaged. Nothing of it was stored; push it again from a good store.`, {
        region: region.key,
        chunk: index,
      });
    }
    hash?.update(chunk);
    let written = 0;
    while (written < chunk.length) written += (await handle.write(chunk, written, chunk.length - written, pos + written)).bytesWritten;
    pos += chunk.length;
  }
}

async function fileSha256(handle: FileHandle, size: number, signal: AbortSignal | undefined): Promise<string> {
  const h = createHash('sha256');
  const buf = Buffer.allocUnsafe(8 * 1024 * 1024);
  for (let off = 0; off < size; ) {
    if (signal?.aborted) throw abortError(signal, 'the pull');
    const { bytesRead } = await handle.read(buf, 0, Math.min(buf.length, size - off), off);
    if (bytesRead === 0) break;
    h.update(buf.subarray(0, bytesRead));
    off += bytesRead;
  }
  return `sha256:${h.digest('hex')}`;
}
