import { randomBytes } from 'node:crypto';
import { lstatSync, mkdirSync, readdirSync, realpathSync, statfsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';

import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { Manifest } from '../manifest/manifest.js';
import { fsyncDir, mkdirParents, replaceFileAtomic, writeFileDurable } from './fsutil.js';
import { checkEntry, type CurrentPointer, parseCurrent, parseSeq, readStoreText, readStoreTextSync } from './layout.js';
import { acquireLock } from './lock.js';
import { validateName } from './names.js';
import { cleanTmp, DIGEST, guard } from './scan.js';
import type { RegionStoreOptions } from './types.js';

const FORMAT_FILE = 'vsnap-store.json';
const FORMAT = 1;
/** The store's publish sequence: a counter raised by every change of a `current` pointer. */
const SEQ_FILE = 'publish-seq';
/** Space kept free beyond what a capture writes. */
const SPACE_MARGIN = 256 * 1024 * 1024;
/** tmp/ entries younger than this are never cleaned (their writer may be just starting). */
const TMP_GRACE_MS = 60_000;
/** Capture ids whose start sequence is remembered until they are published (or dropped). */
const MAX_PENDING_IDS = 4096;
/** Manifests kept parsed (the most recently read), with the text they were parsed from. */
const PARSED_MANIFESTS = 32;

/**
 * The files of one store on disk: their paths (every one checked never to be a link), the two
 * flocks (`.lock` over blobs, `.meta.lock` over manifests and `current` pointers), the publish
 * sequence, `current` pointers and manifest files, the free-space check and the read-only
 * guard. {@link RegionStore} is the user's view of it; {@link CaptureTransaction} writes through it.
 * @internal
 */
export class StoreFiles {
  /** The store's directory (the real path, links above the root resolved once at open). */
  readonly root: string;
  readonly lockTimeoutMs: number;
  /** Opened with `readOnly`: nothing is written; captures, `remove` and `gc` are refused. */
  readonly readOnly: boolean;
  private readonly spaceMargin: number;
  /** The publish sequence number read when each capture id of this store was made. */
  private readonly startSeqs = new Map<string, number>();
  /** The manifests read last, by path, with the text each was parsed from (oldest first). */
  private readonly parsed = new Map<string, { text: string; manifest: Manifest }>();

  private constructor(root: string, lockTimeoutMs: number, spaceMargin: number, readOnly: boolean) {
    this.root = root;
    this.lockTimeoutMs = lockTimeoutMs;
    this.readOnly = readOnly;
    this.spaceMargin = spaceMargin;
  }

  /** Opens (and by default creates) the store at `root`; with `readOnly`, only reads an existing one. */
  static async open(root: string, options: RegionStoreOptions = {}): Promise<StoreFiles> {
    if (typeof root !== 'string' || root.length === 0) {
      throw new VsnapError('E_INVALID_ARGUMENT', `store root must be a directory path, got ${JSON.stringify(root)}`);
    }
    const readOnly = options.readOnly ?? false;
    if (readOnly && options.create === true) invalidArgument('create', 'false with readOnly (a read-only open creates nothing)', true);
    const create = !readOnly && (options.create ?? true);
    let real: string;
    try {
      let exists = true;
      try {
        lstatSync(root);
      } catch {
        exists = false;
      }
      if (!exists) {
        if (!create) throw new VsnapError('E_STORE_INVALID', `no store at ${root}${readOnly ? '' : ' (pass create: true to make one)'}`, { root });
        try {
          mkdirParents(root, 0o755);
        } catch (err) {
          const e = err as NodeJS.ErrnoException;
          throw new VsnapError('E_STORE_INVALID', `cannot make the store directory ${root}: ${e.message}. Choose a path on a writable local filesystem.`, { root, errno: e.code }, { cause: err });
        }
      }
      // The root itself may be reached through links (a mount point, /data -> /mnt/...): resolved
      // here, once. Below it, nothing is followed.
      real = realpathSync(root);
      checkEntry(real, 'dir');
      const formatPath = join(real, FORMAT_FILE);
      const formatText = await readStoreText(formatPath);
      if (formatText === undefined) {
        const entries = readdirSync(real).filter((e) => e !== '.lock' && e !== '.meta.lock');
        if (entries.length > 0) {
          throw new VsnapError(
            'E_STORE_INVALID',
            `${root} is not empty and is not a vsnap store (no ${FORMAT_FILE}); refusing to write into it. Choose an empty or new directory.`,
            { root },
          );
        }
        if (!create) throw new VsnapError('E_STORE_INVALID', `no store at ${root}`, { root });
        replaceFileAtomic(formatPath, join(real, `.${FORMAT_FILE}.tmp`), `${JSON.stringify({ format: FORMAT })}\n`);
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
      for (const dir of ['blobs', 'snapshots', 'tmp']) {
        if (!checkEntry(join(real, dir), 'dir') && !readOnly) mkdirSync(join(real, dir));
      }
      for (const file of ['.lock', '.meta.lock', SEQ_FILE]) checkEntry(join(real, file), 'file');
    } catch (err) {
      throw toVsnapError(err);
    }
    const files = new StoreFiles(real, options.lockTimeoutMs ?? 30_000, options.spaceMarginBytes ?? SPACE_MARGIN, readOnly);
    if (!readOnly) await guard(() => cleanTmp(real, options.tmpGraceMs ?? TMP_GRACE_MS));
    return files;
  }

  /**
   * Where a blob lives. Throws E_STORE_UNSAFE if blobs/, its prefix directory or the blob itself
   * is a link (so no reader or writer goes through one).
   */
  blobPath(digest: string): string {
    if (typeof digest !== 'string' || !DIGEST.test(digest)) invalidDigest(digest);
    const blobs = join(this.root, 'blobs');
    const prefix = join(blobs, digest.slice(0, 2));
    const path = join(prefix, digest);
    if (checkEntry(blobs, 'dir') && checkEntry(prefix, 'dir')) checkEntry(path, 'file');
    return path;
  }

  /** Runs `fn` holding the blob lock: shared (reading blobs, or placing new ones) or exclusive (gc, which deletes them). */
  async withLock<T>(exclusive: boolean, fn: () => Promise<T>): Promise<T> {
    if (exclusive) this.writable('gc');
    const release = await acquireLock(join(this.root, '.lock'), exclusive, this.lockTimeoutMs, this.readOnly);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /** Runs `fn` holding the exclusive lock on manifests and `current` pointers (held briefly). */
  async withMetaLock<T>(fn: () => Promise<T>): Promise<T> {
    this.writable('publish');
    const release = await acquireLock(join(this.root, '.meta.lock'), true, this.lockTimeoutMs);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /** Refuses `what` on a store opened read-only. */
  writable(what: string): void {
    if (this.readOnly) {
      throw new VsnapError('E_INVALID_ARGUMENT', `cannot ${what}: the store at ${this.root} was opened read-only (readOnly: true); open it without readOnly to write`, {
        root: this.root,
      });
    }
  }

  /** Throws E_NO_SPACE if the store's file system cannot take `bytes` more (plus a margin). */
  checkFreeSpace(bytes: number): void {
    const fs = statfsSync(this.root);
    const free = fs.bavail * fs.bsize;
    if (free < bytes + this.spaceMargin) {
      const gib = (n: number): string => `${(n / 2 ** 30).toFixed(2)} GiB`;
      throw new VsnapError(
        'E_NO_SPACE',
        `the store at ${this.root} has ${gib(free)} free; this capture needs up to ${gib(bytes)} plus a ${gib(this.spaceMargin)} margin. ` +
          'Free space (`vsnap rm` old snapshots, then `vsnap gc`) or use another store.',
        { root: this.root, freeBytes: free, neededBytes: bytes + this.spaceMargin },
      );
    }
  }

  /** A fresh path in tmp/ for a small file about to be renamed into place. */
  tmpFilePath(prefix: string): string {
    return join(this.root, 'tmp', `.${prefix}-${randomBytes(6).toString('hex')}`);
  }

  /** The store's publish sequence number now. */
  readSeq(): number {
    return parseSeq(readStoreTextSync(join(this.root, SEQ_FILE)));
  }

  /** Takes the next publish sequence number; call holding the meta lock. */
  nextSeq(atLeast: number): number {
    const next = Math.max(this.readSeq(), atLeast) + 1;
    replaceFileAtomic(join(this.root, SEQ_FILE), this.tmpFilePath('seq'), `${next}\n`);
    return next;
  }

  /** The publish sequence number a capture id started at, if this store made the id (forgotten once taken). */
  takeStartSeq(id: string): number | undefined {
    const seq = this.startSeqs.get(id);
    this.startSeqs.delete(id);
    return seq;
  }

  /**
   * A fresh capture id that remembers the store's publish sequence number now: a capture made
   * with it (even one persisted later from the RAM tier) becomes `current` unless another
   * capture of its name was published after this moment.
   */
  newCaptureId(): string {
    const id = makeCaptureId();
    try {
      this.startSeqs.set(id, this.readSeq());
      // ids of RAM-only captures never persisted are not kept forever: the oldest go first
      if (this.startSeqs.size > MAX_PENDING_IDS) this.startSeqs.delete(this.startSeqs.keys().next().value!);
    } catch (err) {
      throw toVsnapError(err);
    }
    return id;
  }

  /**
   * The id `current` names, if any. Throws E_STORE_INVALID when `current` holds something that
   * is not a capture id (it is never used as a path).
   */
  async currentId(name: string): Promise<string | undefined> {
    validateName(name);
    const pointer = await this.readCurrent(name);
    if (pointer === undefined) return undefined;
    if ('junk' in pointer) {
      throw new VsnapError(
        'E_STORE_INVALID',
        `${this.currentPath(name)} does not name a capture (it holds ${JSON.stringify(pointer.junk.slice(0, 60))}). ` +
          `Capture '${name}' again (the new capture replaces it), or \`vsnap rm ${name}\`.`,
        { name, path: this.currentPath(name) },
      );
    }
    return pointer.id;
  }

  /** The `current` pointer of `name`, undefined when absent. */
  async readCurrent(name: string): Promise<CurrentPointer | undefined> {
    return guard(async () => {
      if (!this.snapshotDirExists(name)) return undefined;
      const text = await readStoreText(this.currentPath(name));
      return text === undefined ? undefined : parseCurrent(text);
    });
  }

  /** Writes `current` (atomically: the rename replaces a link rather than following it). */
  writeCurrent(name: string, id: string, seq: number, tmpPath: string): void {
    replaceFileAtomic(this.currentPath(name), tmpPath, `${id}\n${seq}\n`);
  }

  /** snapshots/<name>/current: the pointer naming the current capture. */
  private currentPath(name: string): string {
    return join(this.snapshotDir(name), 'current');
  }

  /** snapshots/<name> (a path only: {@link StoreFiles.snapshotDirExists} checks it). */
  snapshotDir(name: string): string {
    return join(this.root, 'snapshots', name);
  }

  /**
   * Whether snapshots/<name> exists: a real directory (never a link: E_STORE_UNSAFE), or absent.
   * `create` makes it (durably) when absent.
   */
  snapshotDirExists(name: string, create = false): boolean {
    checkEntry(join(this.root, 'snapshots'), 'dir');
    const dir = this.snapshotDir(name);
    if (checkEntry(dir, 'dir')) return true;
    if (!create) return false;
    mkdirSync(dir);
    fsyncDir(join(this.root, 'snapshots'));
    return true;
  }

  /** snapshots/<name>/<id>.json: the manifest of one capture. */
  manifestPath(name: string, id: string): string {
    return join(this.snapshotDir(name), `${id}.json`);
  }

  /** Writes (and fsyncs) a manifest at `tmpPath`, read-only, to be renamed into place. */
  writeManifestTmp(tmpPath: string, manifest: Manifest): void {
    writeFileDurable(tmpPath, `${JSON.stringify(manifest.toJSON(), null, 1)}\n`, 0o444);
  }

  /** The ids of every manifest of `name`, sorted (oldest first). */
  async manifestIds(name: string): Promise<string[]> {
    if (!this.snapshotDirExists(name)) return [];
    const entries = await readdir(this.snapshotDir(name), { withFileTypes: true });
    return entries
      .filter((e) => (e.isFile() || e.isSymbolicLink()) && e.name.endsWith('.json') && !e.name.startsWith('.'))
      .map((e) => e.name.slice(0, -5))
      .sort();
  }

  /** The manifest of capture `id` of `name`. Throws E_SNAPSHOT_NOT_FOUND, or E_MANIFEST_INVALID when it names another capture. */
  async readManifest(name: string, id: string): Promise<Manifest> {
    const path = this.manifestPath(name, id);
    if (!this.snapshotDirExists(name)) {
      throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no snapshot named '${name}' in ${this.root}`, { name, id });
    }
    const text = await readStoreText(path);
    const kept = this.parsed.get(path);
    this.parsed.delete(path);
    if (text === undefined) {
      throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no capture '${id}' of snapshot '${name}' in ${this.root} (${path} is missing)`, { name, id });
    }
    // The file is read every time, but parsed and validated only when its text changed: a
    // suspend's check reads the current manifest, and parsing one of 252 regions takes 4-8 ms.
    if (kept && kept.text === text) {
      this.parsed.set(path, kept);
      return kept.manifest;
    }
    const manifest = Manifest.parse(text, path);
    if (manifest.id !== id || manifest.name !== name) {
      throw new VsnapError('E_MANIFEST_INVALID', `${path} holds capture '${manifest.id}' of '${manifest.name}', not '${id}' of '${name}': the store was edited by hand.`, {
        name,
        id,
        issues: [{ path: 'id', message: 'does not match the file name' }],
      });
    }
    this.parsed.set(path, { text, manifest });
    for (const oldest of this.parsed.keys()) {
      if (this.parsed.size <= PARSED_MANIFESTS) break;
      this.parsed.delete(oldest);
    }
    return manifest;
  }
}

/** A fresh capture id (unique; its time part orders history, not `current`). */
function makeCaptureId(): string {
  return `${Date.now().toString(36).padStart(9, '0')}-${randomBytes(4).toString('hex')}`;
}

function invalidDigest(digest: unknown): never {
  throw new VsnapError('E_MANIFEST_INVALID', `${JSON.stringify(digest)} is not a blob digest (64 lowercase hex digits)`, { digest });
}
