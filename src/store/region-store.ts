import { rm, unlink } from 'node:fs/promises';
import { join } from 'node:path';

import { toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { TransferOptions } from '../transfer/transfer.js';
import { CaptureTransaction } from './capture-txn.js';
import { StoreFiles } from './files.js';
import { validateName } from './names.js';
import { blobFiles, guard, snapshotEntries } from './scan.js';
import type { RegionStoreOptions, SnapshotList, SnapshotSummary, VerifyReport } from './types.js';
import { verifyManifest } from './verify.js';

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
 * read or while a capture places it; an engine restore takes it before it reads the manifest, so a
 * gc cannot fall between the two. `.meta.lock` guards manifests and `current` pointers, held
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
  /** Opened with `readOnly`: nothing is written; captures, `remove` and `gc` are refused. */
  readonly readOnly: boolean;
  /** The files on disk (paths, locks, publish sequence, pointers, manifests); this object is the user's view of them. */
  private readonly files: StoreFiles;

  private constructor(files: StoreFiles) {
    this.files = files;
    this.root = files.root;
    this.readOnly = files.readOnly;
  }

  /** Opens (and by default creates) the store at `root`; with `readOnly`, only reads an existing one. */
  static async open(root: string, options: RegionStoreOptions = {}): Promise<RegionStore> {
    return new RegionStore(await StoreFiles.open(root, options));
  }

  /**
   * Where a blob lives. Throws E_STORE_UNSAFE if blobs/, its prefix directory or the blob itself
   * is a link (so no reader or writer goes through one). @internal
   */
  blobPath(digest: string): string {
    return this.files.blobPath(digest);
  }

  /**
   * Runs `fn` holding the blob lock: shared (reading blobs, or placing new ones) or exclusive
   * (gc, which deletes them). @internal
   */
  async withLock<T>(exclusive: boolean, fn: () => Promise<T>): Promise<T> {
    return this.files.withLock(exclusive, fn);
  }

  /**
   * Starts a capture: checks free space for `bytes`, then makes a private tmp directory that
   * this process holds a lock on (so no cleaner removes it while in use).
   * @internal
   */
  async beginCapture(name: string, bytes: number, id: string = this.newCaptureId()): Promise<CaptureTransaction> {
    return CaptureTransaction.begin(this.files, name, bytes, id);
  }

  /**
   * A fresh capture id that remembers the store's publish sequence number now: a capture made
   * with it (even one persisted later from the RAM tier) becomes `current` unless another
   * capture of its name was published after this moment. @internal
   */
  newCaptureId(): string {
    return this.files.newCaptureId();
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
          const versions = (await this.files.manifestIds(name)).length;
          out.push({ name, id: manifest.id, createdAt: manifest.data.createdAt, bytes: manifest.totalBytes, storedBytes: manifest.storedBytes, regions: manifest.regionCount, versions });
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
    const id = await this.files.currentId(name);
    return id === undefined ? undefined : guard(() => this.files.readManifest(name, id));
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
    return guard(() => this.files.readManifest(name, id));
  }

  /** Every capture kept for `name`, oldest first. */
  async history(name: string): Promise<Manifest[]> {
    validateName(name);
    return guard(async () => {
      const ids = await this.files.manifestIds(name);
      return Promise.all(ids.map((id) => this.files.readManifest(name, id)));
    });
  }

  /**
   * Re-hashes every blob of a snapshot (at line rate, in parallel) against its manifest and
   * reports every problem found (a corrupt chunk, a truncated or missing blob).
   */
  async verify(name: string, options: TransferOptions & { id?: string } = {}): Promise<VerifyReport> {
    const manifest = await this.get(name, options.id);
    return guard(() => this.withLock(false, () => verifyManifest(this.files, manifest, options)));
  }

  /**
   * Removes a snapshot (every capture of `name`), or one capture of it (`id`). When the current
   * capture is removed, `current` moves to the newest remaining one. Blob bytes are freed by
   * {@link RegionStore.gc}. Returns the ids removed.
   */
  async remove(name: string, options: { id?: string } = {}): Promise<string[]> {
    validateName(name);
    this.files.writable('remove');
    if (options.id !== undefined) validateName(options.id, 'snapshot id');
    return guard(() =>
      this.files.withMetaLock(async () => {
        const dir = this.files.snapshotDir(name);
        const ids = await this.files.manifestIds(name);
        const targets = options.id === undefined ? ids : ids.filter((i) => i === options.id);
        if (targets.length === 0) {
          throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `no snapshot '${name}'${options.id ? ` with id '${options.id}'` : ''} in ${this.root}`, {
            name,
            id: options.id,
          });
        }
        const remaining = ids.filter((i) => !targets.includes(i));
        const tmp = this.files.tmpFilePath('current');
        if (remaining.length > 0) {
          // Move `current` first, so a crash in between leaves a valid pointer.
          const current = await this.files.readCurrent(name);
          if (current === undefined || 'junk' in current || targets.includes(current.id)) {
            this.files.writeCurrent(name, remaining[remaining.length - 1]!, this.files.nextSeq(0), tmp);
          }
        } else {
          await rm(join(dir, 'current'), { force: true });
        }
        // unlink never follows a link: a manifest that is a link loses the link only
        for (const id of targets) await unlink(this.files.manifestPath(name, id));
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
    this.files.writable('gc');
    return guard(() =>
      this.withLock(true, () =>
        this.files.withMetaLock(async () => {
          const referenced = new Set<string>();
          const { names, problems } = await snapshotEntries(this.root);
          const unsafe = problems.find((p) => p.code === 'E_STORE_UNSAFE');
          if (unsafe) throw new VsnapError('E_STORE_UNSAFE', `gc refused: ${unsafe.message}`, { name: unsafe.name });
          for (const name of names) {
            for (const id of await this.files.manifestIds(name)) {
              for (const { region } of (await this.files.readManifest(name, id)).regions()) referenced.add(region.blob);
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
}
