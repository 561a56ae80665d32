import type { EarlyRestore } from './early-restore.js';
import type { RestoreRegion } from './snapshot-types.js';

/*
 * Targets handed to a restore in parts, as their memory is made (Snapshot.restoreStaged, internal):
 * the copy starts on the first part and takes the others as they come. Nothing here knows who makes
 * the memory or who else writes into it; the caller says which regions, and until when.
 */

/**
 * A restore's targets in parts: the regions (by region id) whose memory is in the restore's
 * `regions` now, batches that follow, and the rest once all is made. @internal
 */
export interface StagedTargets {
  readonly first: ReadonlySet<string>;
  /** Rejects when the rest cannot be made (or must not be: the restore then fails with its error). */
  readonly rest: Promise<StagedRest>;
  /** The copy of `first` from the RAM tier, started already (Snapshot.startRestore): the restore takes it over. */
  readonly started?: EarlyRestore;
  /**
   * The rest's regions batch by batch as their memory is made, before `rest` resolves (it then lists
   * them all again): from the RAM tier, those holding a tensor of the model are copied as each batch
   * comes; the others wait for `rest`, which says which of them something else writes into.
   */
  readonly more?: AsyncIterable<readonly RestoreRegion[]>;
}

/**
 * The rest of a restore's targets, and the regions (by region id) something else writes into until
 * `late.after` resolves: those are copied, and digested, only after it (again, if they were among
 * the first). @internal
 */
export interface StagedRest {
  readonly regions: readonly RestoreRegion[];
  readonly late: { readonly ids: ReadonlySet<string>; readonly after: Promise<void> };
}
