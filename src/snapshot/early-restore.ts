import type { RamLease, RamTier } from '../cache/ram-tier.js';
import { VsnapError } from '../errors.js';
import type { StartedCopy } from './copy-types.js';

/**
 * The copy of a snapshot's first regions from the RAM tier, started before restore() is called
 * with them (Snapshot.startRestore; restoreEngine starts it while it reads the engine): restore()
 * takes it over through `stages.started`. Until then it holds the RAM tier's lease on the snapshot;
 * where no restore takes it, abandon() cancels the copy, waits until nothing is in flight into the
 * regions, and lets the lease go.
 * @internal
 */
export class EarlyRestore {
  private taken = false;

  constructor(
    /** The capture it copies. */
    readonly snapshotId: string,
    /** The RAM tier it copies from. */
    readonly cache: RamTier,
    /** The regions (by region id) being copied. */
    readonly ids: ReadonlySet<string>,
    private readonly copy: StartedCopy,
    private readonly lease: RamLease,
  ) {}

  /** restore()'s, once: the copy and the lease are its to finish and release from here on. */
  take(): { copy: StartedCopy; lease: RamLease } {
    if (this.taken) throw new VsnapError('E_INTERNAL', 'an early restore was taken twice, or after it was abandoned');
    this.taken = true;
    return { copy: this.copy, lease: this.lease };
  }

  /** Where no restore took it: cancels the copy, waits until nothing is in flight, lets the lease go. Idempotent. */
  async abandon(): Promise<void> {
    if (this.taken) return;
    this.taken = true;
    try {
      await this.copy.abandon();
    } finally {
      this.lease.release();
    }
  }
}
