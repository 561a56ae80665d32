// A registry written for the tests, on loopback: it serves one vsnap artifact (the OCI manifest,
// the config and the layers, Range included) and takes uploads, as the distribution API does,
// unless a `hostile` handler answers a request first: endless or oversized bodies, 200 to a
// Range request, 416 to every PATCH, a stall, a trickle, a reset mid-layer. Every writer honours
// backpressure and stops when the client goes, so the server itself stays small.
import { createReadStream } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

import { Manifest } from '../../src/manifest/manifest.js';
import { native } from '../../src/native/index.js';
import { buildArtifact, configBlob, OCI_MANIFEST, sha256Digest } from '../../src/registry/artifact.js';
import { hashFile } from '../../src/registry/push.js';
import { blobDigest } from '../../src/manifest/blob-digest.js';
import type { RegionStore } from '../../src/store/region-store.js';
import { patternBytes } from './regions.js';

const KiB = 1024;

/** What the registry serves: one tagged OCI manifest and its blobs (config and layers). */
export interface ServedArtifact {
  readonly repository: string;
  readonly tag: string;
  readonly manifest: Buffer;
  readonly digest: string;
  /** By sha256 digest: the config (in memory) and the layers (store files). */
  readonly blobs: ReadonlyMap<string, { size: number; data?: Buffer; path?: string }>;
}

/** The artifact `vsnap push` makes of snapshot `name` of `store`, served from the store's own files. */
export async function servedArtifact(store: RegionStore, name: string, repository = 'team/m', tag = 'v1'): Promise<ServedArtifact> {
  const manifest = await store.get(name);
  const config = configBlob(manifest);
  const digests = new Map<string, string>();
  const blobs = new Map<string, { size: number; data?: Buffer; path?: string }>();
  for (const { region } of manifest.regions()) {
    if (digests.has(region.blob)) continue;
    const d = await hashFile(store.blobPath(region.blob), region.size, undefined, () => undefined);
    digests.set(region.blob, d);
    blobs.set(d, { size: region.size, path: store.blobPath(region.blob) });
  }
  const artifact = buildArtifact(manifest, config, digests);
  blobs.set(artifact.config.digest, { size: config.length, data: config });
  const body = Buffer.from(JSON.stringify(artifact));
  return { repository, tag, manifest: body, digest: sha256Digest(body), blobs };
}

/**
 * An artifact of `count` distinct one-chunk regions of `size` bytes, made in memory (no capture,
 * no store, no descriptor per region): the regions of `template`'s first rank replaced by
 * patterned ones, each with its own checksum, blob and layer.
 */
export function syntheticArtifact(template: Manifest, count: number, size = 4096, repository = 'team/m', tag = 'v1'): ServedArtifact {
  const base = template.data.ranks[0]!.regions[0]!;
  const layers = new Map<string, string>();
  const blobs = new Map<string, { size: number; data?: Buffer; path?: string }>();
  const regions = Array.from({ length: count }, (_, i) => {
    const key = `r${i}`;
    const data = patternBytes(key, 0, size);
    const checksums = [native().checksum(data)];
    const blob = blobDigest(size, size, checksums);
    const digest = sha256Digest(data);
    layers.set(blob, digest);
    blobs.set(digest, { size, data });
    return { ...base, key, size, chunkSize: size, checksums, blob, tensors: [] };
  });
  const manifest = Manifest.parse({ ...template.data, ranks: [{ ...template.data.ranks[0]!, regions }] });
  const config = configBlob(manifest);
  const artifact = buildArtifact(manifest, config, layers);
  blobs.set(artifact.config.digest, { size: config.length, data: config });
  const body = Buffer.from(JSON.stringify(artifact));
  return { repository, tag, manifest: body, digest: sha256Digest(body), blobs };
}

/** What a request is, as the distribution API names its routes. */
export interface Route {
  readonly kind: 'base' | 'manifest' | 'blob' | 'upload' | 'other';
  readonly method: string;
  /** The blob's digest (blob routes). */
  readonly digest?: string;
  /** The Range header, if sent. */
  readonly range?: string;
}

export interface SeenRequest extends Route {
  readonly url: string;
  readonly authorization?: string;
}

/** Answers a request itself (true), or leaves it to the well-behaved registry (false). */
export type Hostile = (req: IncomingMessage, res: ServerResponse, route: Route) => boolean;

export interface HostileRegistry {
  /** `http://127.0.0.1:<port>`: the reference prefix. */
  readonly prefix: string;
  /** `http://127.0.0.1:<port>`: for URLs the handlers make (a token realm). */
  readonly origin: string;
  /** The reference of the served artifact. */
  readonly reference: string;
  readonly requests: SeenRequest[];
  close(): Promise<void>;
}

function routeOf(req: IncomingMessage): Route {
  const url = new URL(req.url ?? '/', 'http://x');
  const method = req.method ?? 'GET';
  const range = req.headers.range;
  const base = { method, ...(range ? { range } : {}) };
  if (url.pathname === '/v2/' || url.pathname === '/v2') return { kind: 'base', ...base };
  if (/\/manifests\/[^/]+$/.test(url.pathname)) return { kind: 'manifest', ...base };
  const blob = /\/blobs\/(sha256:[a-f0-9]{64})$/.exec(url.pathname);
  if (blob) return { kind: 'blob', digest: blob[1]!, ...base };
  if (url.pathname.includes('/blobs/uploads/')) return { kind: 'upload', ...base };
  return { kind: 'other', ...base };
}

/** Starts the registry on 127.0.0.1. Without `artifact` it serves nothing but takes uploads. */
export async function startHostileRegistry(options: { artifact?: ServedArtifact; hostile?: Hostile } = {}): Promise<HostileRegistry> {
  const requests: SeenRequest[] = [];
  const artifact = options.artifact;
  let uploads = 0;
  const server: Server = createServer((req, res) => {
    const route = routeOf(req);
    requests.push({ ...route, url: req.url ?? '', ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}) });
    res.on('error', () => undefined);
    req.on('error', () => undefined);
    if (options.hostile?.(req, res, route)) return;
    wellBehaved(req, res, route);
  });

  function wellBehaved(req: IncomingMessage, res: ServerResponse, route: Route): void {
    const json = (status: number, body: unknown, headers: Record<string, string> = {}): void => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
    };
    if (route.kind === 'base') return json(200, {});
    if (route.kind === 'manifest' && artifact && (req.url ?? '').endsWith(`/manifests/${artifact.tag}`)) {
      res.writeHead(200, { 'content-type': OCI_MANIFEST, 'content-length': String(artifact.manifest.length), 'docker-content-digest': artifact.digest });
      res.end(req.method === 'HEAD' ? undefined : artifact.manifest);
      return;
    }
    if (route.kind === 'blob' && artifact?.blobs.has(route.digest!)) {
      const blob = artifact.blobs.get(route.digest!)!;
      if (req.method === 'HEAD') return void res.writeHead(200, { 'content-length': String(blob.size) }).end();
      return serveBlob(res, blob, route.range);
    }
    if (route.kind === 'blob' && req.method === 'HEAD') return void res.writeHead(404).end();
    if (route.kind === 'upload') {
      // takes whatever is sent (drained, not kept): enough for the push paths tests drive
      req.resume();
      req.on('end', () => {
        if (req.method === 'POST') return void res.writeHead(202, { location: `${(req.url ?? '').split('?')[0]}${++uploads}`, range: '0-0', 'content-length': '0' }).end();
        if (req.method === 'PATCH') return void res.writeHead(202, { location: req.url!, 'content-length': '0' }).end();
        if (req.method === 'PUT') return void res.writeHead(201, { 'content-length': '0' }).end();
        res.writeHead(405).end();
      });
      return;
    }
    if (route.kind === 'manifest' && req.method === 'PUT') {
      req.resume();
      req.on('end', () => void res.writeHead(201, { 'content-length': '0' }).end());
      return;
    }
    json(404, { errors: [{ code: route.kind === 'manifest' ? 'MANIFEST_UNKNOWN' : 'BLOB_UNKNOWN', message: 'unknown' }] });
  }

  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const origin = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    prefix: origin,
    origin,
    reference: `${origin}/${artifact?.repository ?? 'team/m'}:${artifact?.tag ?? 'v1'}`,
    requests,
    async close() {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

/** A blob's bytes (a Range honoured unless `ignoreRange`), streamed from its file. */
export function serveBlob(res: ServerResponse, blob: { size: number; data?: Buffer; path?: string }, range: string | undefined, ignoreRange = false): void {
  const m = range && !ignoreRange ? /^bytes=(\d+)-(\d+)$/.exec(range) : null;
  const start = m ? Number(m[1]) : 0;
  const end = m ? Math.min(Number(m[2]), blob.size - 1) : blob.size - 1;
  const headers: Record<string, string> = { 'content-type': 'application/octet-stream', 'content-length': String(Math.max(0, end - start + 1)) };
  if (m) headers['content-range'] = `bytes ${start}-${end}/${blob.size}`;
  res.writeHead(m ? 206 : 200, headers);
  if (blob.size === 0) return void res.end();
  if (blob.data) return void res.end(blob.data.subarray(start, end + 1));
  const stream = createReadStream(blob.path!, { start, end });
  res.on('close', () => stream.destroy());
  stream.on('error', () => res.destroy());
  stream.pipe(res);
}

/** How much an endless writer sent, and whether the client hung up before the safety cap. */
export interface Sent {
  bytes: number;
  hungUp: boolean;
  /** Settles when the response is over (the client hung up, or the cap was reached). */
  closed: Promise<void>;
}

/**
 * Sends `piece` over and over, with backpressure, until the client goes away: endless as far as
 * a bounded client can tell. A safety cap (default 256 MiB) ends it, so a client that reads
 * without bound (the defect under test) ends too, with memory bounded, instead of hanging.
 */
export function endless(res: ServerResponse, status: number, headers: Record<string, string> = {}, options: { piece?: Buffer; capBytes?: number } = {}): Sent {
  const piece = options.piece ?? Buffer.alloc(64 * KiB, 0x7b);
  const cap = options.capBytes ?? 256 * 1024 * KiB;
  let closed!: () => void;
  const sent: Sent = { bytes: 0, hungUp: false, closed: new Promise((r) => (closed = r)) };
  res.writeHead(status, headers);
  res.on('close', () => {
    if (!res.writableFinished) sent.hungUp = true;
    closed();
  });
  const pump = (): void => {
    while (!res.destroyed && !res.writableEnded) {
      if (sent.bytes >= cap) return void res.end();
      sent.bytes += piece.length;
      if (!res.write(piece)) return;
    }
  };
  res.on('drain', pump);
  pump();
  return sent;
}

/** Sends `total` bytes (declared in Content-Length), with backpressure. */
export function oversized(res: ServerResponse, status: number, total: number, headers: Record<string, string> = {}, piece: Buffer = Buffer.alloc(64 * KiB, 0x20)): void {
  res.writeHead(status, { ...headers, 'content-length': String(total) });
  let left = total;
  const pump = (): void => {
    while (!res.destroyed && left > 0) {
      const n = Math.min(left, piece.length);
      left -= n;
      if (!res.write(piece.subarray(0, n))) return;
    }
    if (left === 0 && !res.destroyed) res.end();
  };
  res.on('drain', pump);
  pump();
}

/** Sends one byte every `everyMs`, forever, until the client goes away (a trickle, not a stall). */
export function trickle(res: ServerResponse, status: number, headers: Record<string, string> = {}, everyMs = 20): void {
  res.writeHead(status, headers);
  res.flushHeaders();
  const timer = setInterval(() => {
    if (!res.destroyed) res.write('{');
  }, everyMs);
  res.on('close', () => clearInterval(timer));
}
