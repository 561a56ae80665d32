import type { CacheLease, CacheReservation, HostCache } from '../cache/host-cache.js';
import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import type { LiveLayout, LiveRegion } from '../manifest/compat.js';
import { Manifest } from '../manifest/manifest.js';
import type { EngineInfo, ExpectedResponse, ModelInfo, RegionInfo, TensorInfo } from '../manifest/types.js';
import type { NativeTransferResult } from '../native/index.js';
import type { RegionMemory } from '../regions/memory.js';
import { blobDigest } from '../store/digest.js';
import { failpoint } from '../store/failpoints.js';
import { validateName } from '../store/names.js';
import { RegionStore, type VerifyReport } from '../store/region-store.js';
import { persistFromRamTier } from './persist.js';
import { DEFAULT_CHUNK_SIZE } from '../transfer/staging.js';
import { passOn, runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { multipathStats, runMultipath, type MultipathOptions, type MultipathStats } from '../transfer/multipath.js';
import { captureManifest, checkCaptureRegions, platformOf } from './capture-manifest.js';
import { captureDigests, reusableRegions, verifyRestoredByDevice } from './live-check.js';

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
  readonly cache?: HostCache;
  /** When the store gets the capture (default `sync`); see {@link PersistPolicy}. */
  readonly persist?: PersistPolicy;
  /**
   * When the chunks' XXH3 checksums are taken; see {@link CaptureHash}. Default: `deferred` for a
   * capture into the RAM tier only (persist `async` or `off`), `now` otherwise.
   */
  readonly hash?: CaptureHash;
  /**
   * Incremental capture: an earlier capture of these regions in the same store. Regions whose
   * GPU digests are unchanged since it are not read again; the new snapshot shares their blobs.
   * Not with a RAM-tier `cache` reservation (the RAM tier needs every byte).
   */
  readonly base?: Snapshot;
}

/**
 * When a capture reaches the {@link RegionStore}:
 * - `sync`: before {@link Snapshot.capture} resolves (with a `cache`, the bytes land in the RAM
 *   tier and the store in one pass);
 * - `async`: in the background, from the RAM tier (`cache` required); `capture` resolves once the
 *   bytes are in RAM. {@link Snapshot.durable} turns true when the store has them, and
 *   {@link Snapshot.persist} waits for that. Until then a crash of this process loses the capture.
 * - `off`: never by itself (`cache` required): the capture lives in the RAM tier only, until
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
   * Restore through the RAM tier: from the cache when it holds this capture (a bulk DMA, no
   * hashing: verified when loaded), else loaded into it first (every chunk verified before the
   * first byte reaches the target) and then copied. Snapshots larger than the cache stream from
   * the store as without it.
   */
  readonly cache?: HostCache;
  /**
   * Digest the restored memory (on the GPU) and compare with the snapshot's digests (default
   * true; skipped when it has none). Always done for a capture with hash `deferred` not yet
   * persisted: its GPU digests are the only check of its RAM copy.
   */
  readonly verifyDigests?: boolean;
  /**
   * With `cache`: copy from the RAM tier over two PCIe links, the target's and a neighbour GPU's
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


/** How a region is named in transfer errors: its key, prefixed with its rank when there are several ranks. */
function regionLabel(rank: number, key: string, multiRank: boolean): string {
  return multiRank ? `rank ${rank}/${key}` : key;
}

function notDurable(snapshot: Snapshot, what: string): VsnapError {
  return new VsnapError(
    'E_NOT_DURABLE',
    `capture ${snapshot.id} of '${snapshot.name}' (persist 'async' or 'off') is not in the store yet, so ${what} ` +
      'needs the RAM tier that holds it. Pass that HostCache, or call snapshot.persist() first.',
    { name: snapshot.name, id: snapshot.id },
  );
}


/**
 * A snapshot in a {@link RegionStore}: the manifest of one capture, and the operations on it.
 *
 * ```ts
 * const store = await RegionStore.open('/var/lib/vsnap');
 * const snap = await Snapshot.capture(store, 'llama-8b', { regions });
 * // ... later, into the same-sized regions (same keys):
 * await (await Snapshot.open(store, 'llama-8b')).restore({ regions });
 * ```
 * @public
 */
export class Snapshot {
  /** The store holding it. */
  readonly store: RegionStore;
  /** Timing of the capture that created this object (undefined for opened snapshots). */
  readonly lastCapture: TransferSummary | undefined;
  /** The RAM tier holding a capture the store does not have yet. */
  private readonly ramTier: HostCache | undefined;
  private isDurable: boolean;
  private persisting: Promise<void> | undefined;
  private current: Manifest;

  private constructor(store: RegionStore, manifest: Manifest, lastCapture?: TransferSummary, ramTier?: HostCache) {
    this.store = store;
    this.current = manifest;
    this.lastCapture = lastCapture;
    this.ramTier = ramTier;
    this.isDurable = ramTier === undefined;
  }

  /**
   * Whether the store holds this capture (a crash of this process cannot lose it). Always true
   * except after a capture with persist `async` (until written) or `off` (until
   * {@link Snapshot.persist}).
   */
  get durable(): boolean {
    return this.isDurable;
  }

  /**
   * Its manifest. For a capture with hash `deferred`, the one without checksums
   * ({@link Manifest.checksummed} false) until {@link Snapshot.persist} has written it, then the
   * one in the store (same id).
   */
  get manifest(): Manifest {
    return this.current;
  }

  /**
   * Makes the capture durable: waits for the background persistence of an `async` capture, or
   * writes an `off` one (or retries a failed one) from the RAM tier now. Every chunk is hashed
   * (again) on its way to disk and must match the checksum taken when it landed in RAM, or, for a
   * capture with hash `deferred`, the GPU digest taken at capture (E_CHECKSUM otherwise: nothing
   * is written). Resolves at once for a durable snapshot. Throws E_NOT_DURABLE when the RAM tier
   * no longer holds it.
   */
  async persist(options: TransferOptions = {}): Promise<void> {
    if (this.isDurable) return;
    this.persisting ??= persistFromRamTier(this.store, this.current, this.ramTier!, options).then(
      (published) => {
        this.current = published;
        this.isDurable = true;
      },
      (err: unknown) => {
        this.persisting = undefined;
        throw err;
      },
    );
    return this.persisting;
  }

  /** The snapshot's name. */
  get name(): string {
    return this.manifest.name;
  }
  /** This capture's id. */
  get id(): string {
    return this.manifest.id;
  }

  /** The snapshot of a manifest already read from `store`. @internal */
  static of(store: RegionStore, manifest: Manifest): Snapshot {
    return new Snapshot(store, manifest);
  }

  /** The current capture of `name` (or the one with `id`). Throws E_SNAPSHOT_NOT_FOUND. */
  static async open(store: RegionStore, name: string, options: { id?: string } = {}): Promise<Snapshot> {
    return new Snapshot(store, await store.get(name, options.id));
  }

  /**
   * Captures regions into the store under `name`: every region is copied out in chunks,
   * checksummed while streaming, and written as a blob; the manifest is published last, and
   * `current` then names this capture. Identical regions are stored once. With a `cache`, the
   * bytes land in the RAM tier first, and `persist` says when the store gets them (a capture
   * persisted later becomes `current` only if no newer capture of `name` was published since).
   */
  static async capture(store: RegionStore, name: string, options: CaptureOptions): Promise<Snapshot> {
    validateName(name);
    checkCaptureRegions(options.regions);
    const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_SIZE;
    if (!Number.isSafeInteger(chunkSize) || chunkSize <= 0 || chunkSize % 4096 !== 0 || chunkSize > 2 ** 30) {
      invalidArgument('chunkSize', 'a positive multiple of 4096 up to 1 GiB', chunkSize);
    }
    const regions = options.regions;
    const total = regions.reduce((s, r) => s + r.size, 0);
    const { platform, gpus } = await platformOf(regions);

    const persist = options.persist ?? 'sync';
    if (persist !== 'sync' && persist !== 'async' && persist !== 'off') invalidArgument('persist', "'sync', 'async' or 'off'", persist);
    const cache = options.cache;
    if (persist !== 'sync' && !cache) invalidArgument('cache', `a HostCache: persist '${persist}' keeps the capture in the RAM tier`, cache);
    const hash = options.hash ?? (persist === 'sync' ? 'now' : 'deferred');
    if (hash !== 'now' && hash !== 'deferred') invalidArgument('hash', "'now' or 'deferred'", hash);
    if (hash === 'deferred' && persist === 'sync') invalidArgument('hash', "'now' with persist 'sync' (the store needs the checksums in the same pass); 'deferred' needs persist 'async' or 'off'", hash);
    const items = regions.map((r) => ({ rank: r.rank ?? 0, key: r.key, size: r.size }));
    const id = store.newCaptureId();
    const txn = persist === 'sync' ? await store.beginCapture(name, total, id) : undefined;
    let reservation: CacheReservation | undefined;
    try {
      if (cache && (persist !== 'sync' || cache.fits(items))) reservation = cache.reserve(name, id, items);
      // After the free-space check and the reservation: nothing is read from a capture that cannot fit.
      const digestStarted = performance.now();
      const gpuDigests = await captureDigests(regions, chunkSize);
      const digestSeconds = (performance.now() - digestStarted) / 1000;
      // Deferred: the RAM copy is vouched for by the GPU digests, so every region needs one.
      const deferred = hash === 'deferred' && reservation !== undefined && gpuDigests.every((d) => d !== null);
      const base = options.base?.manifest.checksummed ? options.base.manifest : undefined; // a base not persisted has no blobs to share
      const reused = reservation || !txn ? new Map<number, RegionInfo>() : reusableRegions(store, base, regions, chunkSize, gpuDigests);
      const fresh = regions.map((_, i) => i).filter((i) => !reused.has(i));
      const result = fresh.length === 0 ? { checksums: [], seconds: 0 } : await runTransfer({
        op: 'capture',
        label: name,
        regions: fresh.map((i) => ({ i, r: regions[i]! })).map(({ i, r }) => ({
          name: regionLabel(r.rank ?? 0, r.key, regions.some((x) => (x.rank ?? 0) > 0)),
          ...(txn ? { blobPath: txn.blobTmpPath(i) } : {}),
          size: r.size,
          chunkSize,
          memory: r.memory,
          ...(reservation ? { hostCopy: { kind: 'buffer' as const, buffer: reservation.buffer, offset: reservation.offsets.get(`${items[i]!.rank}/${r.key}`)! } } : {}),
        })),
        ...(deferred ? { hash: false } : {}),
        ...passOn(options),
      });
      failpoint('capture.after-transfer');
      const read = result.checksums ?? [];
      const checksums = regions.map((_, i) => (reused.has(i) ? [...reused.get(i)!.checksums] : deferred ? [] : read[fresh.indexOf(i)]!));
      const digests = regions.map((r, i) => reused.get(i)?.blob ?? (deferred ? '' : blobDigest(r.size, chunkSize, checksums[i]!)));
      const manifest = captureManifest({ id, name, regions, chunkSize, checksums, digests, gpuDigests, platform, gpus, options, deferred });
      let dedupedBytes = 0;
      const blobs = regions.map((r, i) => ({ ...(reused.has(i) ? {} : { tmpPath: txn?.blobTmpPath(i) }), size: r.size, digest: digests[i]! }));
      if (txn) ({ dedupedBytes } = await txn.publish(manifest, blobs));
      reservation?.commit(txn !== undefined);
      const seconds = result.seconds;
      const reusedBytes = [...reused.values()].reduce((n, r) => n + r.size, 0);
      const moved = total - reusedBytes;
      const summary: TransferSummary = {
        bytes: moved,
        seconds,
        bytesPerSecond: moved / Math.max(seconds, 1e-9),
        ...(txn ? { dedupedBytes } : {}),
        ...(options.base ? { reusedBytes } : {}),
        hash: deferred ? 'deferred' : 'now',
        digestSeconds,
      };
      const snapshot = new Snapshot(store, manifest, summary, txn ? undefined : cache);
      if (persist === 'async') snapshot.persistInBackground(options);
      return snapshot;
    } catch (err) {
      reservation?.abandon();
      await txn?.abort();
      throw toVsnapError(err);
    }
  }

  /** Starts persisting an `async` capture; a failure is reported as a warning and left for persist() to retry. */
  private persistInBackground(options: TransferOptions): void {
    this.persist(options.threads ? { threads: options.threads } : {}).catch((err: unknown) => {
      process.emitWarning(`persisting capture ${this.id} of '${this.name}' failed: ${(err as Error).message}. It stays in the RAM tier only; call snapshot.persist() to retry.`, {
        code: 'VSNAP_PERSIST',
      });
    });
  }

  /**
   * Restores the snapshot into live regions: checks the layout (every region by rank and key,
   * sizes, tags, and any engine/model/platform facts given) and refuses with E_MANIFEST_MISMATCH
   * listing every difference; then streams each blob, verifying every chunk before it is copied.
   */
  async restore(options: RestoreOptions): Promise<TransferSummary> {
    const manifest = this.current; // the one the bytes are restored by, even if a persist completes meanwhile
    const { devices: copied, ...summary } = await this.restoreBytes(options);
    const live = options.regions.map((r) => ({ rank: r.rank ?? 0, key: r.key, size: r.size, memory: r.memory }));
    // A deferred capture's RAM copy was never hashed: its GPU digests are the one check it gets.
    const digest = await verifyRestoredByDevice(manifest, live, (options.verifyDigests ?? true) || !manifest.checksummed);
    const devices = (copied ?? []).map((d): DeviceTiming => {
      const checked = digest?.devices.find((x) => x.device === d.device);
      return { device: d.device, bytes: d.bytes, hydrateSeconds: d.seconds, ...(checked ? { digestSeconds: checked.seconds } : {}) };
    });
    return {
      ...summary,
      ...(digest ? { digestSeconds: digest.seconds } : {}),
      ...(devices.length ? { devices } : {}),
    };
  }

  private async restoreBytes(options: RestoreOptions): Promise<Omit<TransferSummary, 'devices'> & { devices?: NativeTransferResult['devices'] }> {
    if (!Array.isArray(options?.regions)) invalidArgument('regions', 'an array of restore targets', options?.regions);
    const byRank: LiveRegion[][] = [];
    for (const r of options.regions) {
      const rank = r.rank ?? 0;
      if (!Number.isInteger(rank) || rank < 0) invalidArgument('rank', 'an integer >= 0', r.rank);
      while (byRank.length <= rank) byRank.push([]);
      byRank[rank]!.push({ key: r.key, size: r.size, ...(r.tag !== undefined ? { tag: r.tag } : {}) });
    }
    this.manifest.assertCompatible({ ...(options.live ?? {}), ranks: byRank.map((regions) => ({ regions })) });
    if (!this.isDurable && !options.cache?.has(this.id)) throw notDurable(this, 'a restore');
    const targets = new Map(options.regions.map((r) => [`${r.rank ?? 0}/${r.key}`, r]));
    const verify = options.verify ?? 'chunk';
    const multiRank = this.manifest.data.ranks.length > 1;
    if (verify !== 'chunk' && verify !== 'all-first') invalidArgument('verify', "'chunk' or 'all-first'", verify);
    const common = {
      label: this.name,
      ...passOn(options),
    };
    if (options.cache?.fits(this.manifest)) {
      const started = performance.now();
      const wasHeld = options.cache.has(this.id);
      const lease = await options.cache.acquire(this.store, this.manifest, { ...common, directIo: options.directIo ?? false });
      try {
        if (options.multipath) return await this.restoreMultipath(options.multipath, lease, targets, common, wasHeld, started);
        const result = await runTransfer({
          ...common,
          op: 'copy',
          regions: [...this.manifest.regions()].map(({ rank, region }) => ({
            name: regionLabel(rank, region.key, multiRank),
            size: region.size,
            chunkSize: region.chunkSize,
            hostCopy: { kind: 'buffer' as const, buffer: lease.buffer, offset: lease.offsets.get(`${rank}/${region.key}`)! },
            memory: targets.get(`${rank}/${region.key}`)!.memory,
          })),
        });
        const seconds = wasHeld ? result.seconds : (performance.now() - started) / 1000;
        return { bytes: result.bytes, seconds, bytesPerSecond: result.bytes / Math.max(seconds, 1e-9), tier: wasHeld ? 'ram' : 'store', devices: result.devices };
      } finally {
        lease.release();
      }
    }
    const result = await this.store.withLock(false, () =>
      runTransfer({
        ...common,
        op: 'hydrate',
        verifyFirst: verify === 'all-first',
        regions: [...this.manifest.regions()].map(({ rank, region }) => ({
          name: regionLabel(rank, region.key, multiRank),
          blobPath: this.store.blobPath(region.blob),
          size: region.size,
          chunkSize: region.chunkSize,
          checksums: region.checksums,
          memory: targets.get(`${rank}/${region.key}`)!.memory,
        })),
        directIo: options.directIo ?? false,
      }),
    );
    return { bytes: result.bytes, seconds: result.seconds, bytesPerSecond: result.bytes / Math.max(result.seconds, 1e-9), tier: 'store', devices: result.devices };
  }

  private async restoreMultipath(
    multipath: MultipathOptions,
    lease: CacheLease,
    targets: ReadonlyMap<string, RestoreRegion>,
    common: { label: string } & Pick<TransferOptions, 'onProgress' | 'signal'>,
    wasHeld: boolean,
    started: number,
  ): Promise<Omit<TransferSummary, 'devices'>> {
    const result = await runMultipath({
      ...multipath,
      ...common,
      regions: [...this.manifest.regions()].map(({ rank, region }) => ({
        name: region.key,
        size: region.size,
        memory: targets.get(`${rank}/${region.key}`)!.memory,
        source: { buffer: lease.buffer, offset: lease.offsets.get(`${rank}/${region.key}`)! },
      })),
    });
    const seconds = wasHeld ? result.seconds : (performance.now() - started) / 1000;
    return { bytes: result.bytes, seconds, bytesPerSecond: result.bytes / Math.max(seconds, 1e-9), tier: wasHeld ? 'ram' : 'store', multipath: multipathStats(result) };
  }

  /** Re-hashes every blob of this capture; see {@link RegionStore.verify}. */
  async verify(options: TransferOptions = {}): Promise<VerifyReport> {
    if (!this.isDurable) throw notDurable(this, 'verifying its blobs');
    return this.store.verify(this.name, { ...options, id: this.id });
  }
}
