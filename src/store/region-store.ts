import { randomBytes } from 'node:crypto';
import { lstatSync, mkdirSync, readdirSync, realpathSync, statfsSync } from 'node:fs';
import { readdir, rm, unlink } from 'node:fs/promises';
import { join } from 'node:path';

import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { Manifest } from '../manifest/manifest.js';
import type { TransferOptions } from '../transfer/transfer.js';
import { CaptureTransaction } from './capture-txn.js';
import { fsyncDir, replaceFileAtomic, writeFileDurable } from './fsutil.js';
import { checkEntry, type CurrentPointer, parseCurrent, parseSeq, readStoreText, readStoreTextSync } from './layout.js';
import { acquireLock } from './lock.js';
import { validateName } from './names.js';
import { blobFiles, cleanTmp, DIGEST, guard, snapshotEntries } from './scan.js';
import type { RegionStoreOptions, SnapshotList, SnapshotSummary, VerifyReport } from './types.js';
import { verifyManifest } from './verify.js';

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

export type { RegionStoreOptions, SnapshotList, SnapshotSummary, StoreProblem, VerifyProblem, VerifyReport } from './types.js';

/**
 * Snapshots on disk. Region bytes are content-addressed blobs (`blobs/ab/<digest>`, identical
 * regions stored once); each capture is a manifest (`snapshots/<name>/<id>.json`) and
 * `snapshots/<name>/current` names the newest good one. Every file is published by
 * write-to-tmp, fsync, rename, fsync of the directory, manifest last: a crash at any point
 * leaves the old snapshot or the new one, never a torn one. Stale `tmp/` entries of dead
 * writers are removed at open.
 *
 * The store never follows a symbolic link below its root (a store whose layout has links is
 * refused with E_STORE_UNSAFE), and every error it throws is a {@link VsnapError}.
 *
 * Processes coordinate through two flocks. `.lock` guards blobs: readers (restores, verifies,
 * RAM-tier loads) and publishes hold it shared, `gc` exclusive, so no blob is deleted while
 * read or while a capture places it. `.meta.lock` guards manifests and `current` pointers, held
 * exclusive for a moment by publish, `remove` and `gc`. So a publish waits only for `gc`,
 * `remove` and other publishes, never for a long restore.
 *
 * Which capture is `current` does not depend on the wall clock: every publish takes the next
 * number of a store-wide sequence, and a capture becomes `current` unless a capture of the same
 * name was published after it started.
 * @public
 */
export class RegionStore {
  /** The store's directory (the real path, links above the root resolved once at open). */
  readonly root: string;
  /** @internal */
  readonly lockTimeoutMs: number;
  /** Opened with `readOnly`: nothing is written; captures, `remove` and `gc` are refused. */
  readonly readOnly: boolean;
  private readonly spaceMargin: number;
  /** The publish sequence number read when each capture id of this store was made. */
  private readonly startSeqs = new Map<string, number>();

  private constructor(root: string, lockTimeoutMs: number, spaceMargin: number, readOnly: boolean) {
    this.root = root;
    this.lockTimeoutMs = lockTimeoutMs;
    this.readOnly = readOnly;
    this.spaceMargin = spaceMargin;
  }

  /** Opens (and by default creates) the store at `root`; with `readOnly`, only reads an existing one. */
  static async open(root: string, options: RegionStoreOptions = {}): Promise<RegionStore> {
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
        mkdirSync(root, { recursive: true, mode: 0o755 });
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
    const store = new RegionStore(real, options.lockTimeoutMs ?? 30_000, options.spaceMarginBytes ?? SPACE_MARGIN, readOnly);
    if (!readOnly) await guard(() => cleanTmp(real, options.tmpGraceMs ?? TMP_GRACE_MS));
    return store;
  }

  /**
   * Where a blob lives. Throws E_STORE_UNSAFE if blobs/, its prefix directory or the blob itself
   * is a link (so no reader or writer goes through one). @internal
   */
  blobPath(digest: string): string {
    if (typeof digest !== 'string' || !DIGEST.test(digest)) invalidDigest(digest);
    const blobs = join(this.root, 'blobs');
    const prefix = join(blobs, digest.slice(0, 2));
    const path = join(prefix, digest);
    if (checkEntry(blobs, 'dir') && checkEntry(prefix, 'dir')) checkEntry(path, 'file');
    return path;
  }

  /** @internal */
  get lockPath(): string {
    return join(this.root, '.lock');
  }

  /**
   * Runs `fn` holding the blob lock: shared (reading blobs, or placing new ones) or exclusive
   * (gc, which deletes them). @internal
   */
  async withLock<T>(exclusive: boolean, fn: () => Promise<T>): Promise<T> {
    if (exclusive) this.writable('gc');
    const release = await acquireLock(this.lockPath, exclusive, this.lockTimeoutMs, this.readOnly);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /** Runs `fn` holding the exclusive lock on manifests and `current` pointers (held briefly). @internal */
  async withMetaLock<T>(fn: () => Promise<T>): Promise<T> {
    this.writable('publish');
    const release = await acquireLock(join(this.root, '.meta.lock'), true, this.lockTimeoutMs);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /** The store's publish sequence number now. @internal */
  readSeq(): number {
    return parseSeq(readStoreTextSync(join(this.root, SEQ_FILE)));
  }

  /** Takes the next publish sequence number; call holding the meta lock. @internal */
  nextSeq(atLeast: number): number {
    const next = Math.max(this.readSeq(), atLeast) + 1;
    replaceFileAtomic(join(this.root, SEQ_FILE), join(this.root, 'tmp', `.seq-${randomBytes(6).toString('hex')}`), `${next}\n`);
    return next;
  }

  /** The publish sequence number a capture id started at, if this store made the id. @internal */
  takeStartSeq(id: string): number | undefined {
    const seq = this.startSeqs.get(id);
    this.startSeqs.delete(id);
    return seq;
  }

  /**
   * Starts a capture: checks free space for `bytes`, then makes a private tmp directory that
   * this process holds a lock on (so no cleaner removes it while in use).
   * @internal
   */
  async beginCapture(name: string, bytes: number, id: string = this.newCaptureId()): Promise<CaptureTransaction> {
    validateName(name);
    this.writable('capture');
    try {
      const startSeq = this.takeStartSeq(id) ?? this.readSeq();
      this.checkFreeSpace(bytes);
      checkEntry(join(this.root, 'tmp'), 'dir');
      return CaptureTransaction.begin(this, name, id, startSeq);
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  /** A fresh capture id (unique; its time part orders history, not `current`). @internal */
  static newCaptureId(): string {
    return `${Date.now().toString(36).padStart(9, '0')}-${randomBytes(4).toString('hex')}`;
  }

  /**
   * A fresh capture id that remembers the store's publish sequence number now: a capture made
   * with it (even one persisted later from the RAM tier) becomes `current` unless another
   * capture of its name was published after this moment. @internal
   */
  newCaptureId(): string {
    const id = RegionStore.newCaptureId();
    try {
      this.startSeqs.set(id, this.readSeq());
      // ids of RAM-only captures never persisted are not kept forever: the oldest go first
      if (this.startSeqs.size > MAX_PENDING_IDS) this.startSeqs.delete(this.startSeqs.keys().next().value!);
    } catch (err) {
      throw toVsnapError(err);
    }
    return id;
  }

  /** Throws E_NO_SPACE if the store's file system cannot take `bytes` more (plus a margin). */
  private checkFreeSpace(bytes: number): void {
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

  /**
   * Every snapshot with its current capture, sorted by name. Entries that cannot be read (a
   * damaged manifest or `current`, a stray file, a link) are reported in `problems` beside the
   * healthy ones.
   */
  async list(): Promise<SnapshotList> {
    return guard(async () => {
      const { names, problems } = await snapshotEntries(this.root);
      const out: SnapshotSummary[] = [];
      for (const name of names.sort()) {
        try {
          const manifest = await this.current(name);
          if (!manifest) continue;
          const versions = (await this.manifestIds(name)).length;
          out.push({ name, id: manifest.id, createdAt: manifest.data.createdAt, bytes: manifest.totalBytes, regions: manifest.regionCount, versions });
        } catch (err) {
          const e = toVsnapError(err);
          problems.push({ name, code: e.code, message: e.message });
        }
      }
      problems.sort((x, y) => (x.name < y.name ? -1 : x.name > y.name ? 1 : 0));
      // not enumerable: the list stays a plain array to compare, spread and serialize
      return Object.defineProperty(out, 'problems', { value: problems, enumerable: false }) as SnapshotList;
    });
  }

  /** The newest good capture of `name`, or undefined if there is none. */
  async current(name: string): Promise<Manifest | undefined> {
    const id = await this.currentId(name);
    return id === undefined ? undefined : guard(() => this.readManifest(name, id));
  }

  /**
   * The id `current` names, if any. Throws E_STORE_INVALID when `current` holds something that
   * is not a capture id (it is never used as a path). @internal
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

  /** The `current` pointer of `name`, undefined when absent. @internal */
  async readCurrent(name: string): Promise<CurrentPointer | undefined> {
    return guard(async () => {
      if (!this.snapshotDirExists(name)) return undefined;
      const text = await readStoreText(this.currentPath(name));
      return text === undefined ? undefined : parseCurrent(text);
    });
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
    return guard(() => this.readManifest(name, id));
  }

  /** Every capture kept for `name`, oldest first. */
  async history(name: string): Promise<Manifest[]> {
    validateName(name);
    return guard(async () => {
      const ids = await this.manifestIds(name);
      return Promise.all(ids.map((id) => this.readManifest(name, id)));
    });
  }

  /**
   * Re-hashes every blob of a snapshot (at line rate, in parallel) against its manifest and
   * reports every problem found (a corrupt chunk, a truncated or missing blob).
   */
  async verify(name: string, options: TransferOptions & { id?: string } = {}): Promise<VerifyReport> {
    const manifest = await this.get(name, options.id);
    return guard(() => this.withLock(false, () => verifyManifest(this, manifest, options)));
  }

  /**
   * Removes a snapshot (every capture of `name`), or one capture of it (`id`). When the current
   * capture is removed, `current` moves to the newest remaining one. Blob bytes are freed by
   * {@link RegionStore.gc}. Returns the ids removed.
   */
  async remove(name: string, options: { id?: string } = {}): Promise<string[]> {
    validateName(name);
    this.writable('remove');
    if (options.id !== undefined) validateName(options.id, 'snapshot id');
    return guard(() =>
      this.withMetaLock(async () => {
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
          const current = await this.readCurrent(name);
          if (current === undefined || 'junk' in current || targets.includes(current.id)) {
            this.writeCurrent(name, remaining[remaining.length - 1]!, this.nextSeq(0), tmp);
          }
        } else {
          await rm(join(dir, 'current'), { force: true });
        }
        // unlink never follows a link: a manifest that is a link loses the link only
        for (const id of targets) await unlink(this.manifestPath(name, id));
        if (remaining.length === 0) await rm(dir, { recursive: true, force: true });
        return targets;
      }),
    );
  }

  /**
   * Deletes blobs no manifest references. Refuses (E_MANIFEST_INVALID, E_STORE_INVALID,
   * E_STORE_UNSAFE) if any manifest or snapshot directory cannot be read, rather than risk
   * deleting what it references. Stray files in `blobs/` or `snapshots/` are left alone.
   */
  async gc(): Promise<{ blobsRemoved: number; bytesFreed: number }> {
    this.writable('gc');
    return guard(() =>
      this.withLock(true, () =>
        this.withMetaLock(async () => {
          const referenced = new Set<string>();
          const { names, problems } = await snapshotEntries(this.root);
          const unsafe = problems.find((p) => p.code === 'E_STORE_UNSAFE');
          if (unsafe) throw new VsnapError('E_STORE_UNSAFE', `gc refused: ${unsafe.message}`, { name: unsafe.name });
          for (const name of names) {
            for (const id of await this.manifestIds(name)) {
              for (const { region } of (await this.readManifest(name, id)).regions()) referenced.add(region.blob);
            }
          }
          let blobsRemoved = 0;
          let bytesFreed = 0;
          for await (const blob of blobFiles(this.root)) {
            if (referenced.has(blob.digest)) continue;
            await unlink(blob.path);
            bytesFreed += blob.size;
            blobsRemoved++;
          }
          return { blobsRemoved, bytesFreed };
        }),
      ),
    );
  }

  /** Bytes and count of blobs on disk (after dedupe). */
  async usage(): Promise<{ blobs: number; bytes: number }> {
    return guard(async () => {
      let blobs = 0;
      let bytes = 0;
      for await (const blob of blobFiles(this.root)) {
        blobs++;
        bytes += blob.size;
      }
      return { blobs, bytes };
    });
  }

  /** Nothing to release today; present so stores can be used with `await using`. */
  async close(): Promise<void> {}

  /** Same as {@link RegionStore.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** Refuses `what` on a store opened read-only. */
  private writable(what: string): void {
    if (this.readOnly) {
      throw new VsnapError('E_INVALID_ARGUMENT', `cannot ${what}: the store at ${this.root} was opened read-only (readOnly: true); open it without readOnly to write`, {
        root: this.root,
      });
    }
  }

  /** @internal */
  manifestPath(name: string, id: string): string {
    return join(this.root, 'snapshots', name, `${id}.json`);
  }

  /**
   * Whether snapshots/<name> exists: a real directory (never a link: E_STORE_UNSAFE), or absent.
   * `create` makes it (durably) when absent. @internal
   */
  snapshotDirExists(name: string, create = false): boolean {
    checkEntry(join(this.root, 'snapshots'), 'dir');
    const dir = join(this.root, 'snapshots', name);
    if (checkEntry(dir, 'dir')) return true;
    if (!create) return false;
    mkdirSync(dir);
    fsyncDir(join(this.root, 'snapshots'));
    return true;
  }

  /** @internal Writes `current` (atomically: the rename replaces a link rather than following it). */
  writeCurrent(name: string, id: string, seq: number, tmpPath: string): void {
    replaceFileAtomic(this.currentPath(name), tmpPath, `${id}\n${seq}\n`);
  }

  private currentPath(name: string): string {
    return join(this.root, 'snapshots', name, 'current');
  }

  /** @internal */
  writeManifestTmp(tmpPath: string, manifest: Manifest): void {
    writeFileDurable(tmpPath, `${JSON.stringify(manifest.toJSON(), null, 1)}\n`, 0o444);
  }

  private async manifestIds(name: string): Promise<string[]> {
    if (!this.snapshotDirExists(name)) return [];
    const entries = await readdir(join(this.root, 'snapshots', name), { withFileTypes: true });
    return entries
      .filter((e) => (e.isFile() || e.isSymbolicLink()) && e.name.endsWith('.json') && !e.name.startsWith('.'))
      .map((e) => e.name.slice(0, -5))
      .sort();
  }

  private async readManifest(name: string, id: string): Promise<Manifest> {
    const path = this.manifestPath(name, id);
    if (!this.snapshotDirExists(name)) {
      throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no snapshot named '${name}' in ${this.root}`, { name, id });
    }
    const text = await readStoreText(path);
    if (text === undefined) {
      throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no capture '${id}' of snapshot '${name}' in ${this.root} (${path} is missing)`, { name, id });
    }
    const manifest = Manifest.parse(text, path);
    if (manifest.id !== id || manifest.name !== name) {
      throw new VsnapError('E_MANIFEST_INVALID', `${path} holds capture '${manifest.id}' of '${manifest.name}', not '${id}' of '${name}': the store was edited by hand.`, {
        name,
        id,
        issues: [{ path: 'id', message: 'does not match the file name' }],
      });
    }
    return manifest;
  }
}

function invalidDigest(digest: unknown): never {
  throw new VsnapError('E_MANIFEST_INVALID', `${JSON.stringify(digest)} is not a blob digest (64 lowercase hex digits)`, { digest });
}
