import { chmodSync, lstatSync, mkdirSync, renameSync, unlinkSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';

import { toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import { failpoint } from './failpoints.js';
import type { StoreFiles } from './files.js';
import { fsyncDir, mkdirDurable } from './fsutil.js';
import { checkEntry } from './layout.js';
import { tryLock } from './lock.js';
import { validateName } from './names.js';

/**
 * One capture in flight: a private directory under tmp/ that blobs are written into, then
 * published into the store in crash-safe order, or thrown away.
 * @internal
 */
export class CaptureTransaction {
  readonly id: string;
  readonly dir: string;
  private readonly files: StoreFiles;
  private readonly name: string;
  /** The store's publish sequence number when this capture started. */
  readonly startSeq: number;
  private readonly releaseOwnLock: () => void;
  private done = false;

  private constructor(files: StoreFiles, name: string, id: string, startSeq: number, releaseOwnLock: () => void) {
    this.files = files;
    this.name = name;
    this.id = id;
    this.startSeq = startSeq;
    this.dir = join(files.root, 'tmp', id);
    this.releaseOwnLock = releaseOwnLock;
  }

  /**
   * Starts a capture of `name` with capture id `id`: checks free space for `bytes`, then makes a
   * private tmp directory that this process holds a lock on (so no cleaner removes it while in use).
   */
  static begin(files: StoreFiles, name: string, bytes: number, id: string): CaptureTransaction {
    validateName(name);
    files.writable('capture');
    try {
      const startSeq = files.takeStartSeq(id) ?? files.readSeq();
      files.checkFreeSpace(bytes);
      checkEntry(join(files.root, 'tmp'), 'dir');
      return CaptureTransaction.lockAndMake(files, name, id, startSeq);
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  private static lockAndMake(files: StoreFiles, name: string, id: string, startSeq: number): CaptureTransaction {
    // The lock file comes first and stays locked while this capture lives: cleaners skip it.
    const release = tryLock(join(files.root, 'tmp', `${id}.lock`), true);
    if (!release) throw new VsnapError('E_INTERNAL', `capture id ${id} is already in use`);
    const txn = new CaptureTransaction(files, name, id, startSeq, release);
    try {
      mkdirSync(txn.dir); // fails on anything already there, a link included
    } catch (err) {
      release();
      throw toVsnapError(err);
    }
    return txn;
  }

  /** Where region number `index` is written during the capture. */
  blobTmpPath(index: number): string {
    return join(this.dir, `${index}.blob`);
  }

  /**
   * Publishes the captured blobs and the manifest. Blobs are placed holding the blob lock shared
   * (only gc is excluded; restores and verifies go on): renamed into blobs/ (over an identical
   * stored blob, which they replace), their directories fsynced. Then, holding the meta lock for
   * a moment: the manifest, and `current` unless a capture of this name was published after this
   * one started (the store's publish sequence, not the wall clock, decides). A crash before the
   * manifest leaves only unreferenced blobs (removed by gc); before `current`, a complete but
   * non-current capture. Returns how many bytes were already stored.
   */
  async publish(manifest: Manifest, blobs: ReadonlyArray<{ tmpPath?: string | undefined; digest: string; size: number }>): Promise<{ dedupedBytes: number }> {
    let dedupedBytes = 0;
    try {
      if (manifest.name !== this.name || manifest.id !== this.id) {
        throw new VsnapError('E_INTERNAL', `capture ${this.id} of '${this.name}' was asked to publish manifest ${manifest.id} of '${manifest.name}'`);
      }
      await this.files.withLock(false, async () => {
        const touched = new Set<string>();
        const placed = new Set<string>();
        for (const blob of blobs) {
          const dest = this.files.blobPath(blob.digest); // refuses a linked prefix or blob
          // No tmpPath: shared with an earlier capture (incremental), and it must still be stored.
          if (blob.tmpPath === undefined) {
            if (!lstatSync(dest, { throwIfNoEntry: false })?.isFile()) throw new VsnapError('E_BLOB_MISSING', `blob ${blob.digest} shared with an earlier capture was removed meanwhile; capture again`, { blob: blob.digest });
            continue;
          }
          if (placed.has(blob.digest)) {
            // the same bytes twice in this capture: one file serves both
            unlinkSync(blob.tmpPath);
            dedupedBytes += blob.size;
            continue;
          }
          // An identical blob may already be stored. The fresh copy replaces it anyway: it was just
          // written and checksummed from the source, so a stored copy that rotted since is healed
          // rather than trusted. Readers holding the old file keep reading it.
          if (exists(dest)) dedupedBytes += blob.size;
          mkdirDurable(dirname(dest));
          chmodSync(blob.tmpPath, 0o444);
          renameSync(blob.tmpPath, dest);
          placed.add(blob.digest);
          touched.add(dirname(dest));
          failpoint('publish.blob');
        }
        for (const dir of touched) fsyncDir(dir);
        failpoint('publish.after-blobs');

        await this.files.withMetaLock(async () => {
          failpoint('publish.meta-locked');
          this.files.snapshotDirExists(this.name, true); // a real directory, never a link
          const manifestTmp = join(this.dir, 'manifest.json');
          this.files.writeManifestTmp(manifestTmp, manifest);
          failpoint('publish.manifest-written');
          renameSync(manifestTmp, this.files.manifestPath(this.name, manifest.id));
          fsyncDir(dirname(this.files.manifestPath(this.name, manifest.id)));
          failpoint('publish.after-manifest');

          // `current` moves unless a capture of this name was published after this one started.
          const current = await this.files.readCurrent(this.name);
          const newer = current !== undefined && !('junk' in current) && current.id !== manifest.id && current.seq > this.startSeq;
          if (!newer) {
            const seq = this.files.nextSeq(current && !('junk' in current) ? current.seq : 0);
            failpoint('publish.seq-taken');
            this.files.writeCurrent(this.name, manifest.id, seq, join(this.dir, 'current'));
            failpoint('publish.after-current');
          }
        });
      });
    } catch (err) {
      await this.abort();
      throw toVsnapError(err);
    }
    await this.abort();
    return { dedupedBytes };
  }

  /** Throws away whatever is left of the capture. Idempotent. */
  async abort(): Promise<void> {
    if (this.done) return;
    this.done = true;
    try {
      await rm(this.dir, { recursive: true, force: true });
      await rm(`${this.dir}.lock`, { force: true });
    } finally {
      this.releaseOwnLock();
    }
  }
}

function exists(path: string): boolean {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
}
