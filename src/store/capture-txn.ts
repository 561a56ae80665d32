import { chmodSync, existsSync, mkdirSync, renameSync, unlinkSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';

import { toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import { failpoint } from './failpoints.js';
import { fsyncDir, mkdirDurable } from './fsutil.js';
import { tryLock } from './lock.js';
import type { RegionStore } from './region-store.js';

/**
 * One capture in flight: a private directory under tmp/ that blobs are written into, then
 * published into the store in crash-safe order, or thrown away.
 * @internal
 */
export class CaptureTransaction {
  readonly id: string;
  readonly dir: string;
  private readonly store: RegionStore;
  private readonly name: string;
  private readonly releaseOwnLock: () => void;
  private done = false;

  private constructor(store: RegionStore, name: string, id: string, releaseOwnLock: () => void) {
    this.store = store;
    this.name = name;
    this.id = id;
    this.dir = join(store.root, 'tmp', id);
    this.releaseOwnLock = releaseOwnLock;
  }

  static begin(store: RegionStore, name: string, id: string): CaptureTransaction {
    // The lock file comes first and stays locked while this capture lives: cleaners skip it.
    const release = tryLock(join(store.root, 'tmp', `${id}.lock`), true);
    if (!release) throw new VsnapError('E_INTERNAL', `capture id ${id} is already in use`);
    const txn = new CaptureTransaction(store, name, id, release);
    try {
      mkdirSync(txn.dir);
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
   * Publishes the captured blobs and the manifest, under the exclusive store lock:
   * blobs renamed into blobs/ (over an identical stored blob, which they replace), their
   * directories fsynced; then the manifest; then `current` (unless it names a newer capture). A crash before the manifest leaves only
   * unreferenced blobs (removed by gc); before `current`, a complete but non-current capture.
   * Returns how many bytes were already stored (the store did not grow by them).
   */
  async publish(manifest: Manifest, blobs: ReadonlyArray<{ tmpPath?: string | undefined; digest: string; size: number }>): Promise<{ dedupedBytes: number }> {
    let dedupedBytes = 0;
    try {
      await this.store.withLock(true, async () => {
        const touched = new Set<string>();
        const placed = new Set<string>();
        for (const blob of blobs) {
          const dest = this.store.blobPath(blob.digest);
          // No tmpPath: shared with an earlier capture (incremental), and it must still be stored.
          if (blob.tmpPath === undefined) {
            if (!existsSync(dest)) throw new VsnapError('E_BLOB_MISSING', `blob ${blob.digest} shared with an earlier capture was removed meanwhile; capture again`, { blob: blob.digest });
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
          if (existsSync(dest)) dedupedBytes += blob.size;
          mkdirDurable(dirname(dest));
          chmodSync(blob.tmpPath, 0o444);
          renameSync(blob.tmpPath, dest);
          placed.add(blob.digest);
          touched.add(dirname(dest));
        }
        for (const dir of touched) fsyncDir(dir);
        failpoint('publish.after-blobs');

        const snapshotDir = join(this.store.root, 'snapshots', this.name);
        mkdirDurable(snapshotDir);
        const manifestTmp = join(this.dir, 'manifest.json');
        this.store.writeManifestTmp(manifestTmp, manifest);
        renameSync(manifestTmp, this.store.manifestPath(this.name, manifest.id));
        fsyncDir(snapshotDir);
        failpoint('publish.after-manifest');

        // Ids are time-ordered: a capture persisted late (persist 'async' or 'off') never
        // replaces a newer one as `current`.
        const current = await this.store.currentId(this.name);
        if (current === undefined || current < manifest.id) this.store.writeCurrent(this.name, manifest.id, join(this.dir, 'current'));
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
    await rm(this.dir, { recursive: true, force: true });
    await rm(`${this.dir}.lock`, { force: true });
    this.releaseOwnLock();
  }
}
