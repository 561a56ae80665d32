// The public shapes of the region store's options and results.

/**
 * Options of {@link RegionStore.open}.
 * @public
 */
export interface RegionStoreOptions {
  /** Create the directory (and the store in it) if missing. Default true (false when `readOnly`). */
  create?: boolean;
  /**
   * Open for reading only (list, verify, restore, load into a RAM tier): nothing is created,
   * written or cleaned, and blob reads take a shared flock on an existing `.lock` opened
   * read-only, so a store the process may not write (a read-only mount, another user's files)
   * opens. Captures, `remove` and `gc` are refused with E_INVALID_ARGUMENT. Default false.
   */
  readOnly?: boolean;
  /** How long to wait for another process's store lock. Default 30 s. */
  lockTimeoutMs?: number;
  /** @internal tmp/ entries younger than this are never cleaned (tests shorten it). */
  tmpGraceMs?: number;
  /** @internal Free space kept beyond what a capture writes (default 256 MiB; tests lower it). */
  spaceMarginBytes?: number;
}

/**
 * Something in the store that {@link RegionStore.list} could not read as a snapshot: a damaged
 * manifest or pointer, a stray file, a link. Healthy snapshots are listed beside it.
 * @public
 */
export interface StoreProblem {
  /** The entry's name under `snapshots/` (a snapshot name, or whatever stray name is there). */
  readonly name: string;
  /** E_MANIFEST_INVALID, E_STORE_INVALID, E_STORE_UNSAFE, E_SNAPSHOT_NOT_FOUND, ... */
  readonly code: string;
  /** What was found and what to do. */
  readonly message: string;
}

/**
 * The snapshots of a store, sorted by name, with `problems` listing every entry that could not
 * be read (one bad manifest never hides the healthy snapshots).
 * @public
 */
export type SnapshotList = SnapshotSummary[] & {
  /** Entries under `snapshots/` that are not readable snapshots. */
  readonly problems: readonly StoreProblem[];
};

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
  /** Bytes its blobs take in the store: less than `bytes` where they are coded ({@link Manifest.storedBytes}). */
  readonly storedBytes: number;
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
