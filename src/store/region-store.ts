import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, statfsSync, statSync } from 'node:fs';
import { readdir, readFile, rm, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';

import { toVsnapError, VsnapError } from '../errors.js';
import { Manifest } from '../manifest/manifest.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { CaptureTransaction } from './capture-txn.js';
import { blobDigest } from './digest.js';
import { readTextIfExists, replaceFileAtomic, writeFileDurable } from './fsutil.js';
import { acquireLock, tryLock } from './lock.js';
import { validateName } from './names.js';

const FORMAT_FILE = 'vsnap-store.json';
const FORMAT = 1;
/** Space kept free beyond what a capture writes. */
const SPACE_MARGIN = 256 * 1024 * 1024;
/** tmp/ entries younger than this are never cleaned (their writer may be just starting). */
const TMP_GRACE_MS = 60_000;

/**
 * Options of {@link RegionStore.open}.
 * @public
 */
export interface RegionStoreOptions {
  /** Create the directory (and the store in it) if missing. Default true. */
  create?: boolean;
  /** How long to wait for another process's store lock. Default 30 s. */
  lockTimeoutMs?: number;
  /** @internal tmp/ entries younger than this are never cleaned (tests shorten it). */
  tmpGraceMs?: number;
}

/**
 * One snapshot name in a store.
 * @public
 */
export interface SnapshotSummary {
  /** The snapshot's name. */
  readonly name: string;
  /** The id `current` names (the newest good capture). */
  readonly id: string;
  /** When the current capture was made (ISO 8601). */
  readonly createdAt: string;
  /** Bytes of region data in the current capture. */
  readonly bytes: number;
  /** Regions in the current capture. */
  readonly regions: number;
  /** Captures of this name kept in the store (current included). */
  readonly versions: number;
}

/**
 * A problem found by {@link RegionStore.verify}.
 * @public
 */
export interface VerifyProblem {
  /** The rank of the damaged region. */
  readonly rank: number;
  /** The damaged region's key. */
  readonly region: string;
  /** The error code (E_CHECKSUM, E_BLOB_TRUNCATED, E_BLOB_MISSING, ...). */
  readonly code: string;
  /** What was found and what to do. */
  readonly message: string;
}

/**
 * The result of re-hashing a snapshot's blobs.
 * @public
 */
export interface VerifyReport {
  /** The snapshot verified. */
  readonly name: string;
  /** The capture verified. */
  readonly id: string;
  /** True when no problem was found. */
  readonly ok: boolean;
  /** Bytes re-hashed. */
  readonly bytes: number;
  /** Wall time. */
  readonly seconds: number;
  /** Every problem found, one per damaged region. */
  readonly problems: readonly VerifyProblem[];
}

/**
 * Snapshots on disk. Region bytes are content-addressed blobs (`blobs/ab/<digest>`, identical
 * regions stored once); each capture is a manifest (`snapshots/<name>/<id>.json`) and
 * `snapshots/<name>/current` names the newest good one. Every file is published by
 * write-to-tmp, fsync, rename, fsync of the directory, manifest last: a crash at any point
 * leaves the old snapshot or the new one, never a torn one. Processes coordinate through an
 * flock on `.lock`. Stale `tmp/` entries of dead writers are removed at open.
 * @public
 */
export class RegionStore {
  /** The store's directory. */
  readonly root: string;
  /** @internal */
  readonly lockTimeoutMs: number;

  private constructor(root: string, lockTimeoutMs: number) {
    this.root = root;
    this.lockTimeoutMs = lockTimeoutMs;
  }

  /** Opens (and by default creates) the store at `root`. */
  static async open(root: string, options: RegionStoreOptions = {}): Promise<RegionStore> {
    if (typeof root !== 'string' || root.length === 0) {
      throw new VsnapError('E_INVALID_ARGUMENT', `store root must be a directory path, got ${JSON.stringify(root)}`);
    }
    const create = options.create ?? true;
    try {
      const formatPath = join(root, FORMAT_FILE);
      if (!existsSync(root)) {
        if (!create) throw new VsnapError('E_STORE_INVALID', `no store at ${root} (pass create: true to make one)`, { root });
        mkdirSync(root, { recursive: true, mode: 0o755 });
      }
      const formatText = await readTextIfExists(formatPath);
      if (formatText === undefined) {
        const entries = readdirSync(root).filter((e) => e !== '.lock');
        if (entries.length > 0) {
          throw new VsnapError(
            'E_STORE_INVALID',
            `${root} is not empty and is not a vsnap store (no ${FORMAT_FILE}); refusing to write into it. Choose an empty or new directory.`,
            { root },
          );
        }
        if (!create) throw new VsnapError('E_STORE_INVALID', `no store at ${root}`, { root });
        replaceFileAtomic(formatPath, join(root, `.${FORMAT_FILE}.tmp`), `${JSON.stringify({ format: FORMAT })}\n`);
      } else {
        let format: unknown;
        try {
          format = (JSON.parse(formatText) as { format?: unknown }).format;
        } catch {
          format = undefined;
        }
        if (format !== FORMAT) {
          throw new VsnapError(
            'E_STORE_INVALID',
            `${root} has store format ${JSON.stringify(format)}; this vsnap reads format ${FORMAT}. Upgrade vsnap or use another directory.`,
            { root, format },
          );
        }
      }
      for (const dir of ['blobs', 'snapshots', 'tmp']) mkdirSync(join(root, dir), { recursive: true });
    } catch (err) {
      throw toVsnapError(err);
    }
    const store = new RegionStore(root, options.lockTimeoutMs ?? 30_000);
    await store.cleanTmp(options.tmpGraceMs ?? TMP_GRACE_MS);
    return store;
  }

  /** Where a blob lives. @internal */
  blobPath(digest: string): string {
    return join(this.root, 'blobs', digest.slice(0, 2), digest);
  }

  /** @internal */
  get lockPath(): string {
    return join(this.root, '.lock');
  }

  /** Runs `fn` holding the store lock (shared for readers, exclusive for writers). @internal */
  async withLock<T>(exclusive: boolean, fn: () => Promise<T>): Promise<T> {
    const release = await acquireLock(this.lockPath, exclusive, this.lockTimeoutMs);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /**
   * Starts a capture: checks free space for `bytes`, then makes a private tmp directory that
   * this process holds a lock on (so no cleaner removes it while in use).
   * @internal
   */
  async beginCapture(name: string, bytes: number, id: string = RegionStore.newCaptureId()): Promise<CaptureTransaction> {
    validateName(name);
    this.checkFreeSpace(bytes);
    return CaptureTransaction.begin(this, name, id);
  }

  /** A fresh capture id: time-ordered, unique. @internal */
  static newCaptureId(): string {
    return `${Date.now().toString(36).padStart(9, '0')}-${randomBytes(4).toString('hex')}`;
  }

  /** Throws E_NO_SPACE if the store's file system cannot take `bytes` more (plus a margin). */
  private checkFreeSpace(bytes: number): void {
    const fs = statfsSync(this.root);
    const free = fs.bavail * fs.bsize;
    if (free < bytes + SPACE_MARGIN) {
      const gib = (n: number): string => `${(n / 2 ** 30).toFixed(2)} GiB`;
      throw new VsnapError(
        'E_NO_SPACE',
        `the store at ${this.root} has ${gib(free)} free; this capture needs up to ${gib(bytes)} plus a ${gib(SPACE_MARGIN)} margin. ` +
          'Free space (`vsnap rm` old snapshots, then `vsnap gc`) or use another store.',
        { root: this.root, freeBytes: free, neededBytes: bytes + SPACE_MARGIN },
      );
    }
  }

  /** Names of all snapshots with their current capture, sorted by name. */
  async list(): Promise<SnapshotSummary[]> {
    const names = (await this.snapshotNames()).sort();
    const out: SnapshotSummary[] = [];
    for (const name of names) {
      const manifest = await this.current(name);
      if (!manifest) continue;
      const versions = (await this.manifestIds(name)).length;
      out.push({
        name,
        id: manifest.id,
        createdAt: manifest.data.createdAt,
        bytes: manifest.totalBytes,
        regions: manifest.regionCount,
        versions,
      });
    }
    return out;
  }

  /** The newest good capture of `name`, or undefined if there is none. */
  async current(name: string): Promise<Manifest | undefined> {
    const id = await this.currentId(name);
    return id === undefined ? undefined : this.readManifest(name, id);
  }

  /** The id `current` names, if any. @internal */
  async currentId(name: string): Promise<string | undefined> {
    validateName(name);
    return (await readTextIfExists(this.currentPath(name)))?.trim() || undefined;
  }

  /** A capture of `name`: the current one, or the one with `id`. Throws E_SNAPSHOT_NOT_FOUND. */
  async get(name: string, id?: string): Promise<Manifest> {
    validateName(name);
    if (id === undefined) {
      const m = await this.current(name);
      if (!m) throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no snapshot named '${name}' in ${this.root}`, { name, root: this.root });
      return m;
    }
    validateName(id, 'snapshot id');
    if (!existsSync(this.manifestPath(name, id))) {
      throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no capture '${id}' of snapshot '${name}' in ${this.root}`, { name, id });
    }
    return this.readManifest(name, id);
  }

  /** Every capture kept for `name`, oldest first. */
  async history(name: string): Promise<Manifest[]> {
    validateName(name);
    const ids = await this.manifestIds(name);
    return Promise.all(ids.map((id) => this.readManifest(name, id)));
  }

  /**
   * Re-hashes every blob of a snapshot (at line rate, in parallel) against its manifest and
   * reports every problem found (a corrupt chunk, a truncated or missing blob, a blob whose
   * name does not match its checksums).
   */
  async verify(name: string, options: TransferOptions & { id?: string } = {}): Promise<VerifyReport> {
    const manifest = await this.get(name, options.id);
    const started = performance.now();
    const problems: VerifyProblem[] = [];
    await this.withLock(false, async () => {
      const regions = [...manifest.regions()].filter(({ rank, region }) => {
        if (blobDigest(region.size, region.chunkSize, region.checksums) === region.blob) return true;
        problems.push({ rank, region: region.key, code: 'E_MANIFEST_INVALID', message: `blob name ${region.blob} does not match the region's checksums` });
        return false;
      });
      const job = (subset: typeof regions, onProgress?: TransferOptions['onProgress']) =>
        runTransfer({
          op: 'verify',
          label: name,
          regions: subset.map(({ region }) => ({
            name: region.key,
            blobPath: this.blobPath(region.blob),
            size: region.size,
            chunkSize: region.chunkSize,
            checksums: region.checksums,
          })),
          ...(options.signal ? { signal: options.signal } : {}),
          ...(options.threads ? { threads: options.threads } : {}),
          directIo: options.directIo ?? false,
          ...(onProgress ? { onProgress } : {}),
        });
      try {
        // One job over every region keeps all threads busy; it stops at the first problem.
        await job(regions, options.onProgress);
        return;
      } catch (err) {
        const e = toVsnapError(err);
        if (e.code === 'E_ABORTED' || e.code === 'E_NATIVE_LOAD' || e.code === 'E_INVALID_ARGUMENT') throw e;
      }
      // Something is damaged: go region by region to report every problem, not just the first.
      for (const entry of regions) {
        try {
          await job([entry]);
        } catch (err) {
          const e = toVsnapError(err);
          if (e.code === 'E_ABORTED') throw e;
          problems.push({ rank: entry.rank, region: entry.region.key, code: e.code, message: e.message });
        }
      }
    });
    return {
      name,
      id: manifest.id,
      ok: problems.length === 0,
      bytes: manifest.totalBytes,
      seconds: (performance.now() - started) / 1000,
      problems,
    };
  }

  /**
   * Removes a snapshot (every capture of `name`), or one capture of it (`id`). When the current
   * capture is removed, `current` moves to the newest remaining one. Blob bytes are freed by
   * {@link RegionStore.gc}. Returns the ids removed.
   */
  async remove(name: string, options: { id?: string } = {}): Promise<string[]> {
    validateName(name);
    if (options.id !== undefined) validateName(options.id, 'snapshot id');
    return this.withLock(true, async () => {
      const dir = join(this.root, 'snapshots', name);
      const ids = await this.manifestIds(name);
      const targets = options.id === undefined ? ids : ids.filter((i) => i === options.id);
      if (targets.length === 0) {
        throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no snapshot '${name}'${options.id ? ` with id '${options.id}'` : ''} in ${this.root}`, {
          name,
          id: options.id,
        });
      }
      const remaining = ids.filter((i) => !targets.includes(i));
      const tmp = join(this.root, 'tmp', `.current-${randomBytes(6).toString('hex')}`);
      if (remaining.length > 0) {
        // Move `current` first, so a crash in between leaves a valid pointer.
        this.writeCurrent(name, remaining[remaining.length - 1]!, tmp);
      } else {
        await rm(join(dir, 'current'), { force: true });
      }
      for (const id of targets) await unlink(this.manifestPath(name, id));
      if (remaining.length === 0) await rm(dir, { recursive: true, force: true });
      return targets;
    });
  }

  /**
   * Deletes blobs no manifest references. Refuses (E_MANIFEST_INVALID) if any manifest cannot
   * be read, rather than risk deleting what it references.
   */
  async gc(): Promise<{ blobsRemoved: number; bytesFreed: number }> {
    return this.withLock(true, async () => {
      const referenced = new Set<string>();
      for (const name of await this.snapshotNames()) {
        for (const id of await this.manifestIds(name)) {
          for (const { region } of (await this.readManifest(name, id)).regions()) referenced.add(region.blob);
        }
      }
      let blobsRemoved = 0;
      let bytesFreed = 0;
      for await (const blob of this.blobFiles()) {
        if (referenced.has(blob.digest)) continue;
        await unlink(blob.path);
        bytesFreed += blob.size;
        blobsRemoved++;
      }
      return { blobsRemoved, bytesFreed };
    });
  }

  /** Bytes and count of blobs on disk (after dedupe). */
  async usage(): Promise<{ blobs: number; bytes: number }> {
    let blobs = 0;
    let bytes = 0;
    for await (const blob of this.blobFiles()) {
      blobs++;
      bytes += blob.size;
    }
    return { blobs, bytes };
  }

  /** Every blob file on disk. */
  private async *blobFiles(): AsyncGenerator<{ path: string; digest: string; size: number }> {
    const root = join(this.root, 'blobs');
    for (const prefix of await readdir(root)) {
      for (const digest of await readdir(join(root, prefix))) {
        const path = join(root, prefix, digest);
        yield { path, digest, size: (await stat(path)).size };
      }
    }
  }

  /** The snapshot names (directories under snapshots/, dot-entries skipped). */
  private async snapshotNames(): Promise<string[]> {
    return (await readdir(join(this.root, 'snapshots'))).filter((n) => !n.startsWith('.'));
  }

  /** Nothing to release today; present so stores can be used with `await using`. */
  async close(): Promise<void> {}

  /** Same as {@link RegionStore.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** @internal */
  manifestPath(name: string, id: string): string {
    return join(this.root, 'snapshots', name, `${id}.json`);
  }

  /** @internal */
  writeCurrent(name: string, id: string, tmpPath: string): void {
    replaceFileAtomic(this.currentPath(name), tmpPath, `${id}\n`);
  }

  private currentPath(name: string): string {
    return join(this.root, 'snapshots', name, 'current');
  }

  /** @internal */
  writeManifestTmp(tmpPath: string, manifest: Manifest): void {
    writeFileDurable(tmpPath, `${JSON.stringify(manifest.toJSON(), null, 1)}\n`, 0o444);
  }

  private async manifestIds(name: string): Promise<string[]> {
    let entries: string[];
    try {
      entries = await readdir(join(this.root, 'snapshots', name));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw toVsnapError(err);
    }
    return entries.filter((e) => e.endsWith('.json') && !e.startsWith('.')).map((e) => e.slice(0, -5)).sort();
  }

  private async readManifest(name: string, id: string): Promise<Manifest> {
    const path = this.manifestPath(name, id);
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `snapshot '${name}' names capture '${id}', whose manifest ${path} is missing`, { name, id });
      }
      throw toVsnapError(err);
    }
    return Manifest.parse(text, path);
  }

  /** Removes tmp/ entries of writers that died: unlocked, and older than a grace period. */
  private async cleanTmp(graceMs: number): Promise<void> {
    const tmp = join(this.root, 'tmp');
    const now = Date.now();
    for (const entry of await readdir(tmp)) {
      const path = join(tmp, entry);
      let mtime: number;
      try {
        mtime = statSync(path).mtimeMs;
      } catch {
        continue;
      }
      if (now - mtime < graceMs) continue;
      if (entry.endsWith('.lock')) {
        const release = tryLock(path, true);
        if (!release) continue; // its writer is alive
        try {
          await rm(path.slice(0, -'.lock'.length), { recursive: true, force: true });
          await rm(path, { force: true });
        } finally {
          release();
        }
      } else if (!existsSync(`${path}.lock`)) {
        await rm(path, { recursive: true, force: true });
      }
    }
  }
}
