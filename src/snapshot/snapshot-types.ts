// The options and results of Snapshot's capture and restore (public types; the class is in snapshot.ts).

import type { RamTier } from '../cache/ram-tier.js';
import type { LiveLayout, LiveRegion } from '../manifest/compat.js';
import type { Manifest } from '../manifest/manifest.js';
import type { EngineInfo, ExpectedResponse, ModelInfo, TensorInfo } from '../manifest/types.js';
import type { RegionMemory } from '../regions/memory.js';
import type { MultipathOptions, MultipathStats } from '../transfer/multipath.js';
import type { TransferOptions } from '../transfer/transfer.js';
import type { StoreCodec } from './coded-capture.js';

/**
 * A region to capture.
 * @public
 */
export interface CaptureRegion {
  /** Order-independent identity used to match it at restore (engines: lowest-offset tensor name, else `anon:N`). */
  readonly key: string;
  /** Bytes to capture from the start of the memory. */
  readonly size: number;
  /** Where the bytes are read from. */
  readonly memory: RegionMemory;
  /** The allocator tag. Default `weights`. */
  readonly tag?: string;
  /** The engine rank (GPU) it belongs to. Default 0. */
  readonly rank?: number;
  /** For `imported` memory: the device ordinal in this process (for the platform record). */
  readonly device?: number;
  /** The tensors inside, as the engine describes them. */
  readonly tensors?: readonly TensorInfo[];
}

/**
 * Options of {@link Snapshot.capture}.
 * @public
 */
export interface CaptureOptions extends TransferOptions {
  /** The regions to capture; keys unique within a rank. */
  readonly regions: readonly CaptureRegion[];
  /** The engine captured from, recorded in the manifest. */
  readonly engine?: Partial<EngineInfo> & Pick<EngineInfo, 'kind' | 'version'>;
  /** The model held, recorded in the manifest. */
  readonly model?: Partial<ModelInfo> & Pick<ModelInfo, 'id'>;
  /** A greedy completion to re-run after restores. */
  readonly expectedResponse?: ExpectedResponse;
  /** Free-form labels. */
  readonly labels?: Readonly<Record<string, string>>;
  /** Checksum granularity, a multiple of 4096 (default 64 MiB). */
  readonly chunkSize?: number;
  /**
   * Land the capture in this RAM tier (pinned host memory) first: the bytes are copied from the
   * GPU straight into it (and hashed there, with hash `now`), so the GPU memory can be freed at
   * D2H speed, and a later restore from it is a bulk DMA. With `persist: 'sync'` a capture that
   * does not fit goes to the store only.
   */
  readonly ram?: RamTier;
  /** When the store gets the capture (default `sync`); see {@link PersistPolicy}. */
  readonly persist?: PersistPolicy;
  /**
   * When the chunks' XXH3 checksums are taken; see {@link CaptureHash}. Default: `deferred` for a
   * capture into the RAM tier only (persist `async` or `off`), `now` otherwise.
   */
  readonly hash?: CaptureHash;
  /**
   * Incremental capture: an earlier capture (a {@link Snapshot}) of these regions in the same store. Regions whose
   * GPU digests are unchanged since it are not read again; the new snapshot shares their blobs.
   * Not with a `ram` tier reservation (the RAM tier needs every byte).
   */
  readonly base?: { readonly manifest: Manifest };
  /**
   * How the store's blobs are written (default `off`: the raw bytes). `vsnap-c1`: each region's
   * blob is coded chunk by chunk on the CPU before it is published (docs/compression.md), so a
   * cold restore and a registry push or pull move fewer bytes; a region none of whose chunks
   * shrinks stays raw. Checksums and GPU digests stay those of the raw bytes; restores from the
   * store decode on the CPU. With persist `async` or `off`, applies when the RAM tier's copy is
   * persisted. Regions shared with a `base` keep their blobs as they are.
   */
  readonly codec?: StoreCodec;
}

/**
 * When a capture reaches the {@link RegionStore}:
 * - `sync`: before {@link Snapshot.capture} resolves (with a `ram` tier, the bytes land in the RAM
 *   tier and the store in one pass);
 * - `async`: in the background, from the RAM tier (`ram` required); `capture` resolves once the
 *   bytes are in RAM. {@link Snapshot.durable} turns true when the store has them, and
 *   {@link Snapshot.persist} waits for that. Until then a crash of this process loses the capture.
 * - `off`: never by itself (`ram` required): the capture lives in the RAM tier only, until
 *   {@link Snapshot.persist} writes it, or it is evicted explicitly. The RAM tier never evicts a
 *   capture it holds the only copy of to make room.
 * @public
 */
export type PersistPolicy = 'sync' | 'async' | 'off';

/**
 * When a capture takes the XXH3-128 checksums of its chunks (what the store names and checks
 * blobs by):
 * - `now`: on the capture workers, as each chunk lands (in the RAM tier, or on its way to the
 *   store).
 * - `deferred`: the capture into the RAM tier is a bulk DMA with no host hashing in its path. The
 *   GPU digests of the source regions, taken on the GPU at capture before the copy (the engine is
 *   paused: the bytes cannot change), vouch for the RAM copy instead: every restore from it
 *   compares the restored memory with them before it resolves (even with `verifyDigests: false`),
 *   and {@link Snapshot.persist} checks the RAM copy against them while it computes the checksums
 *   the store writes, the same as a `now` capture of the same bytes (same blobs, shared).
 *   Needs persist `async` or `off`. A capture whose GPU digests cannot be taken hashes `now`.
 *
 * The default is `deferred` where it applies (persist `async` or `off`): it frees the GPU at D2H
 * speed, and the hash it defers checked nothing a restore from RAM relies on (the RAM copy is
 * checked on the GPU after every restore either way). With persist `sync` the store needs the
 * checksums in the same pass, so it is `now`.
 * @public
 */
export type CaptureHash = 'now' | 'deferred';

/**
 * Where to restore one region.
 * @public
 */
export interface RestoreRegion extends LiveRegion {
  /** Where the bytes are written. */
  readonly memory: RegionMemory;
  /** Default 0. */
  readonly rank?: number;
}

/**
 * Options of {@link Snapshot.restore}.
 * @public
 */
export interface RestoreOptions extends TransferOptions {
  /** Every region of the snapshot, matched by rank and key (order does not matter). */
  readonly regions: readonly RestoreRegion[];
  /** Engine, model and platform facts of the live side, checked against the manifest too. */
  readonly live?: Omit<LiveLayout, 'ranks'>;
  /**
   * `chunk` (default): each chunk is verified in host memory before it is copied, so no corrupt
   * byte reaches the target, but chunks before a corrupt one are written; right for memory that
   * holds nothing yet (a woken engine). `all-first`: every chunk of every region is verified
   * before the first byte is written, so a corrupt snapshot leaves the target untouched; costs a
   * second read of the blobs.
   */
  readonly verify?: 'chunk' | 'all-first';
  /**
   * Restore through this RAM tier: from it when it holds this capture (a bulk DMA, no
   * hashing: verified when loaded), else loaded into it first (every chunk verified before the
   * first byte reaches the target) and then copied. Snapshots larger than the tier stream from
   * the store as without it.
   */
  readonly ram?: RamTier;
  /**
   * Digest the restored memory (on the GPU) and compare with the snapshot's digests (default
   * true; skipped when it has none). Always done for a capture with hash `deferred` not yet
   * persisted: its GPU digests are the only check of its RAM copy; and for a restore from the
   * store that decodes coded blobs on the GPU (docs/compression.md): they are the only check of
   * the decoded bytes.
   */
  readonly verifyDigests?: boolean;
  /**
   * With `ram`: copy from the RAM tier over two PCIe links, the target's and a neighbour GPU's
   * (docs/multipath.md). Every region must be on one GPU. The restored memory is then checked
   * with the GPU digest as after any restore.
   */
  readonly multipath?: MultipathOptions;
}

/**
 * What a capture or restore did.
 * @public
 */
export interface TransferSummary {
  /** Bytes moved. */
  readonly bytes: number;
  /** Wall time of the transfer itself. */
  readonly seconds: number;
  /** bytes / seconds. */
  readonly bytesPerSecond: number;
  /** capture only: bytes not written again because an identical blob was already stored. */
  readonly dedupedBytes?: number;
  /** restore only: `ram` when the bytes came from the RAM tier as it was, `store` otherwise. */
  readonly tier?: 'gpu' | 'ram' | 'store';
  /** capture with a `base`: bytes not read again, shared with the base (total = bytes + reusedBytes). */
  readonly reusedBytes?: number;
  /** capture only: when the chunks' checksums were taken (`deferred`: on persist); see {@link CaptureHash}. */
  readonly hash?: CaptureHash;
  /** Seconds spent on GPU digests (capture: of the live regions; restore: verification). */
  readonly digestSeconds?: number;
  /** restore with `multipath`: how the bytes were split between the paths. */
  readonly multipath?: MultipathStats;
  /** restore: each GPU's share, where the regions are GPU memory (with tensor parallelism, one per rank). */
  readonly devices?: readonly DeviceTiming[];
}

/**
 * One GPU's share of a restore: every GPU's bytes move (and are then checked) at the same time,
 * each GPU by its own context and stream, so these say where the time went.
 * @public
 */
export interface DeviceTiming {
  /** The GPU's ordinal in this process. */
  readonly device: number;
  /** Bytes restored to it. */
  readonly bytes: number;
  /** Seconds from the start of the copy until its last byte had landed. */
  readonly hydrateSeconds: number;
  /** Seconds its digest check took (absent when none ran). */
  readonly digestSeconds?: number;
}
