import { createHash, type Hash } from 'node:crypto';
import { lstatSync } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';

import { abortError, toVsnapError, VsnapError } from '../errors.js';
import { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import { native } from '../native/index.js';
import { blobDigest, codedBlobDigest } from '../manifest/blob-digest.js';
import { codedOffsets, storedBytes } from '../store/coded-blob.js';
import { decodeChunkOffThread } from '../transfer/codec.js';
import type { RegionStore } from '../store/region-store.js';
import { ANNOTATION, OCI_MANIFEST, parseArtifact, sha256Digest, type Descriptor, type SnapshotArtifact } from './artifact.js';
import { BODY_LIMITS, type OciHttp } from './http.js';
import { BufferPool, runPool } from './pool.js';
import { formatReference } from './reference.js';
import type { PullCompatibility, RegistryProgress } from './types.js';

/** A snapshot's OCI manifest and vsnap manifest, fetched without any layer. @internal */
export interface ResolvedArtifact {
  readonly digest: string;
  readonly artifact: SnapshotArtifact;
  readonly manifest: Manifest;
}

/**
 * GETs the OCI manifest (at most BODY_LIMITS.manifest bytes) and the config blob (exactly its
 * descriptor's size, at most BODY_LIMITS.config), nothing else, checking both digests.
 * @internal
 */
export async function resolveArtifact(http: OciHttp, signal: AbortSignal | undefined): Promise<ResolvedArtifact> {
  const where = formatReference(http.ref);
  const res = await http.send('GET', http.repoPath(`manifests/${http.ref.reference}`), { headers: { accept: OCI_MANIFEST }, ok: [200], signal, what: `pull ${where}` });
  const text = await res.body.text(
    BODY_LIMITS.manifest,
    (n) => new VsnapError('E_REGISTRY', `${where}: the registry sent a manifest of ${n} bytes or more; an OCI manifest is at most ${BODY_LIMITS.manifest} bytes (4 MiB, as the distribution spec and registries bound it). Refusing it.`, { reference: where, url: urlOf(res.url), limit: BODY_LIMITS.manifest }),
  );
  const digest = sha256Digest(text);
  if (http.ref.reference.startsWith('sha256:') && digest !== http.ref.reference) {
    throw new VsnapError('E_CHECKSUM', `${where}: the registry sent a manifest whose digest is ${digest}; refusing it`, { reference: where, digest });
  }
  const artifact = parseArtifact(text, where);
  if (artifact.config.size > BODY_LIMITS.config) throw new VsnapError('E_REGISTRY', `${where}: config of ${artifact.config.size} bytes is too large for a vsnap manifest (at most ${BODY_LIMITS.config})`, { reference: where, limit: BODY_LIMITS.config });
  const cres = await http.send('GET', http.repoPath(`blobs/${artifact.config.digest}`), { ok: [200], signal, what: `pull the config of ${where}` });
  // never more than the descriptor says: a longer body is refused as soon as it passes the size
  const config = await cres.body.read(
    artifact.config.size,
    (n) => new VsnapError('E_CHECKSUM', `${where}: the config blob is ${n} bytes or more, its descriptor says ${artifact.config.size}; refusing it`, { reference: where, url: urlOf(cres.url) }),
  );
  if (config.length !== artifact.config.size || sha256Digest(config) !== artifact.config.digest) {
    throw new VsnapError('E_CHECKSUM', `${where}: the config blob does not match its digest ${artifact.config.digest}; refusing it`, { reference: where });
  }
  return { digest, artifact, manifest: Manifest.parse(config.toString('utf8'), `the config of ${where}`) };
}

function urlOf(url: URL): string {
  return `${url.origin}${url.pathname}`;
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
  /** The layer's bytes: the region's size, or its coded chunks' (`codec`). */
  readonly stored: number;
  /** Where each chunk starts in the layer, then its end: coded chunks differ in size. */
  readonly bounds: readonly number[];
}

/** Chunk boundaries in a region's blob: every `chunkSize` bytes, or the coded sizes'. */
function chunkBounds(region: RegionInfo): number[] {
  if (region.codec) return codedOffsets(region.codec);
  const out: number[] = [];
  for (let at = 0; at < region.size; at += region.chunkSize) out.push(at);
  out.push(region.size);
  return out;
}

/** The index of the chunk starting at `pos` (a boundary). */
function chunkAt(bounds: readonly number[], pos: number): number {
  let lo = 0;
  let hi = bounds.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (bounds[mid]! < pos) lo = mid + 1;
    else hi = mid;
  }
  return lo;
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
    const stored = storedBytes(region);
    if (layer!.size !== stored) bad(`is ${stored} bytes${region.codec ? ' coded' : ''} in the config, its layer ${layer!.size}`);
    // the store names blobs by their chunk checksums (and coded sizes): a config whose names and checksums disagree is refused
    const name = region.codec ? codedBlobDigest(region.size, region.chunkSize, region.checksums, region.codec.name, region.codec.codedSizes) : blobDigest(region.size, region.chunkSize, region.checksums);
    if (name !== region.blob) bad('names a blob its checksums do not give');
    plans.push({ region, layer: layer!, index: plans.length, stored, bounds: chunkBounds(region) });
  }
  return plans;
}

interface PullJob {
  readonly http: OciHttp;
  readonly connections: number;
  readonly rangeMinBytes: number;
  /** Bytes of chunk buffers held at once (each part being downloaded holds one chunk). */
  readonly maxBufferedBytes: number;
  readonly signal?: AbortSignal | undefined;
  readonly onProgress?: ((p: RegistryProgress) => void) | undefined;
}

/**
 * One blob being downloaded: its file in the transaction is opened when its first part starts
 * and closed when its last part ends (so at most `connections` blob files are open, whatever
 * the number of blobs), after its sha256 is checked and it is fsynced.
 */
class BlobDownload {
  partsLeft = 0;
  /** sha256 while streaming, when the blob comes in one part. */
  hash: Hash | undefined;
  private handle: Promise<FileHandle> | undefined;
  private closed = false;

  constructor(
    readonly plan: BlobPlan,
    readonly path: string,
  ) {}

  file(): Promise<FileHandle> {
    this.handle ??= open(this.path, 'wx+', 0o644);
    return this.handle;
  }

  /** Checks the whole blob's sha256, fsyncs and closes it. */
  async finish(where: string, signal: AbortSignal | undefined): Promise<void> {
    const { region, layer } = this.plan;
    const handle = await this.file();
    const digest = this.hash ? `sha256:${this.hash.digest('hex')}` : await fileSha256(handle, this.plan.stored, signal);
    if (digest !== layer.digest) {
      throw new VsnapError('E_CHECKSUM', `${where}: layer ${layer.digest} (region ${region.key}) arrived with sha256 ${digest}; nothing of it was stored`, { reference: where, region: region.key });
    }
    await handle.sync();
    await this.close();
  }

  async close(): Promise<void> {
    if (this.closed || !this.handle) return;
    this.closed = true;
    await (await this.handle.catch(() => undefined))?.close().catch(() => undefined);
  }
}

interface Part {
  readonly blob: BlobDownload;
  readonly start: number;
  readonly end: number;
}

/**
 * Downloads the blobs the store lacks into a capture transaction of the store (its tmp
 * directory, its locks, its crash-safe publish), each chunk checked against its xxh3 checksum
 * as it arrives and each blob against its sha256, then publishes the manifest under `name`.
 * Anything damaged throws before the publish, and the transaction's files are removed. Parts
 * are planned blob by blob as connections free up; each holds one chunk buffer out of
 * `maxBufferedBytes` (reused from part to part).
 * @internal
 */
export async function pullInto(store: RegionStore, resolved: ResolvedArtifact, name: string, job: PullJob): Promise<{ manifest: Manifest; bytesDownloaded: number; bytesSkipped: number }> {
  const where = formatReference(job.http.ref);
  const manifest = name === resolved.manifest.name ? resolved.manifest : Manifest.parse({ ...resolved.manifest.data, name });
  const plans = planLayers(resolved, where);
  const missing = plans.filter((p) => !lstatSync(store.blobPath(p.region.blob), { throwIfNoEntry: false })?.isFile());
  const bytesDownloaded = missing.reduce((n, p) => n + p.stored, 0);
  const bytesSkipped = plans.reduce((n, p) => n + p.stored, 0) - bytesDownloaded;
  const txn = await store.beginCapture(name, bytesDownloaded, manifest.id);
  const started: BlobDownload[] = [];
  try {
    let done = 0;
    const progress = (n: number): void => {
      done += n;
      job.onProgress?.({ phase: 'downloading', bytesDone: done, bytesTotal: bytesDownloaded });
    };
    const buffers = new BufferPool(job.maxBufferedBytes);
    // one part per blob, or several for a large one (aligned to its chunk size), planned when the
    // blob's turn comes: a registry found to ignore Range by then gets the blob in one GET
    function* parts(): Generator<Part> {
      for (const plan of missing) {
        const blob = new BlobDownload(plan, txn.blobTmpPath(plan.index));
        started.push(blob);
        const { stored: size, bounds } = plan;
        const chunks = bounds.length - 1;
        const n = size >= job.rangeMinBytes && !job.http.rangeIgnored ? Math.min(job.connections, chunks) : 1;
        if (n <= 1) {
          blob.hash = createHash('sha256');
          blob.partsLeft = 1;
          yield { blob, start: 0, end: size };
          continue;
        }
        const per = Math.ceil(chunks / n); // chunks a part
        blob.partsLeft = Math.ceil(chunks / per);
        for (let first = 0; first < chunks; first += per) yield { blob, start: bounds[first]!, end: bounds[Math.min(chunks, first + per)]! };
      }
    }
    try {
      await runPool(parts(), job.connections, async (part) => {
        const lent = await buffers.take(Math.min(largestChunk(part.blob.plan), part.end - part.start));
        try {
          await fetchPart(job, part, lent.buffer, progress);
        } finally {
          lent.give();
        }
        if (--part.blob.partsLeft === 0) await part.blob.finish(where, job.signal);
      });
    } finally {
      for (const b of started) await b.close();
    }
    job.onProgress?.({ phase: 'publishing', bytesDone: done, bytesTotal: bytesDownloaded });
    const missingSet = new Set(missing);
    await txn.publish(
      manifest,
      plans.map((p) => ({ ...(missingSet.has(p) ? { tmpPath: txn.blobTmpPath(p.index) } : {}), digest: p.region.blob, size: p.stored })),
    );
    return { manifest, bytesDownloaded, bytesSkipped };
  } catch (err) {
    await txn.abort();
    // a cancelled request fails inside undici with its own error: reported as the cancellation
    if (job.signal?.aborted) throw abortError(job.signal, 'the pull');
    throw toVsnapError(err);
  }
}

/**
 * GETs bytes [start, end) of a layer (a Range request unless it is the whole blob), checking
 * each chunk as it completes. A registry that answers a Range request with 200 (the whole blob)
 * is read as a stream: the bytes before `start` are dropped, the part's bytes taken, and the
 * connection closed at `end`; later blobs are then fetched whole.
 */
async function fetchPart(job: PullJob, part: Part, buf: Buffer, progress: (n: number) => void): Promise<void> {
  const { blob, start, end } = part;
  const { region, layer, bounds } = blob.plan;
  const whole = start === 0 && end === blob.plan.stored;
  const res = await job.http.send('GET', job.http.repoPath(`blobs/${layer.digest}`), {
    headers: whole ? {} : { range: `bytes=${start}-${end - 1}` },
    ok: whole ? [200] : [200, 206],
    signal: job.signal,
    what: `download layer ${layer.digest}`,
  });
  const fromWhole = !whole && res.status === 200;
  if (fromWhole) job.http.rangeIgnored = true;
  else if (!whole) checkContentRange(res.headers['content-range'], start, end, layer.digest, res.url);
  let skip = fromWhole ? start : 0;
  const handle = await blob.file();
  // `buf`: one chunk buffer for the part (lent by the pull's BufferPool), filled in place: a fresh
  // buffer per chunk costs a page fault per 4 KiB, which halved the rate on the machines measured.
  let pos = start;
  let index = chunkAt(bounds, start);
  let filled = 0;
  let extra = 0;
  try {
    for await (const data of res.body.chunks()) {
      if (job.signal?.aborted) throw abortError(job.signal, 'the pull');
      job.http.counters.bytesReceived += data.length;
      let off = Math.min(skip, data.length);
      skip -= off;
      const skipped = off;
      while (off < data.length) {
        const want = Math.min((bounds[index + 1] ?? end) - pos, end - pos);
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
      progress(off - skipped);
      if (extra > 0 || (fromWhole && pos === end)) break; // (leaving the loop closes the connection)
    }
  } finally {
    await res.body.dump();
  }
  if (pos !== end || filled !== 0 || (extra !== 0 && !fromWhole)) {
    throw new VsnapError('E_BLOB_TRUNCATED', `layer ${layer.digest} (region ${region.key}): expected bytes ${start}-${end - 1}, the registry sent ${pos - start + filled + extra}; nothing of it was stored`, { region: region.key });
  }

  async function storeChunk(chunk: Buffer): Promise<void> {
    // a coded chunk is decoded on the CPU and its bytes checked as a raw one's: the store holds only blobs that decode to their checksums
    const raw = region.codec ? await decodeLayerChunk(chunk, region, index, layer.digest) : chunk;
    if (native().checksum(raw) !== region.checksums[index]) {
      throw new VsnapError('E_CHECKSUM', `layer ${layer.digest} (region ${region.key}): chunk ${index} does not match its checksum; the registry's copy is damaged. Nothing of it was stored; push it again from a good store.`, {
        region: region.key,
        chunk: index,
      });
    }
    blob.hash?.update(chunk);
    let written = 0;
    while (written < chunk.length) written += (await handle.write(chunk, written, chunk.length - written, pos + written)).bytesWritten;
    pos += chunk.length;
    index++;
  }
}

/** Decodes chunk `index` of a coded layer; a damaged one is E_CODEC_CORRUPT naming the region, the chunk and the layer. */
async function decodeLayerChunk(chunk: Buffer, region: RegionInfo, index: number, digest: string): Promise<Buffer> {
  try {
    return await decodeChunkOffThread(chunk, Math.min(region.chunkSize, region.size - index * region.chunkSize), { chunk: index, region: region.key });
  } catch (err) {
    const e = toVsnapError(err);
    if (e.code !== 'E_CODEC_CORRUPT') throw e;
    throw new VsnapError('E_CODEC_CORRUPT', `layer ${digest} (region ${region.key}): chunk ${index} is damaged (${String(e.details.reason)}); the registry's copy is damaged. Nothing of it was stored; push it again from a good store.`, { ...e.details, layer: digest }, { cause: e });
  }
}

/** The largest chunk of a blob as stored (a coded one may be up to its header larger than the chunk size). */
function largestChunk(plan: BlobPlan): number {
  let most = 0;
  for (let i = 1; i < plan.bounds.length; i++) most = Math.max(most, plan.bounds[i]! - plan.bounds[i - 1]!);
  return most;
}

/** A 206 must be the range asked for (when it says which): another range is refused, not stitched in. */
function checkContentRange(header: string | string[] | undefined, start: number, end: number, digest: string, url: URL): void {
  const value = Array.isArray(header) ? header[0] : header;
  if (value === undefined) return; // the chunk checksums still check every byte
  const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(value.trim());
  if (!m || Number(m[1]) !== start || Number(m[2]) !== end - 1) {
    throw new VsnapError('E_REGISTRY', `download layer ${digest}: asked ${urlOf(url)} for bytes ${start}-${end - 1}, it answered Content-Range ${JSON.stringify(value.slice(0, 100))}; refusing it`, { url: urlOf(url) });
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
