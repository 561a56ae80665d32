import type { RamLease, RamReservation, RamTier } from '../cache/ram-tier.js';
import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { checkOptions } from '../options.js';
import type { LiveRegion } from '../manifest/compat.js';
import { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import type { NativeTransferResult } from '../native/index.js';
import { blobDigest } from '../manifest/blob-digest.js';
import { failpoint, pausePoint } from '../store/failpoints.js';
import { validateName } from '../store/names.js';
import { RegionStore, type VerifyReport } from '../store/region-store.js';
import { persistFromRamTier } from './persist.js';
import { DEFAULT_CHUNK_SIZE } from '../transfer/staging.js';
import { passOn, runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { multipathStats, runMultipath, type MultipathOptions } from '../transfer/multipath.js';
import { captureManifest, checkCaptureRegions, platformOf } from './capture-manifest.js';
import { captureDigests, reusableRegions } from './capture-digests.js';
import { copyInStages, ramCopyItem, ramCopyPlan, startCopy } from './copy-overlap.js';
import { EarlyRestore } from './early-restore.js';
import { restoreCoded } from './coded-restore.js';
import { checkStoreCodec, codeCapturedBlobs, type StoreCodec } from './coded-capture.js';
import { storedBytes } from '../store/coded-blob.js';
import { restoreFromStore } from './store-restore.js';
import { onDevice, scratchShortage } from '../cache/coded-tier.js';
import { type DigestPlan, planVerify, verifyPlanned, verifyRestoredByDevice } from '../digest/compare.js';
import type { CaptureOptions, DeviceTiming, RestoreOptions, RestoreRegion, TransferSummary } from './snapshot-types.js';
import type { StagedRest, StagedTargets } from './staged.js';
import { regionId } from '../manifest/region-id.js';

const TRANSFER_OPTIONS = ['onProgress', 'signal', 'threads', 'directIo'];
const CAPTURE_OPTIONS = ['regions', 'engine', 'model', 'expectedResponse', 'labels', 'chunkSize', 'ram', 'persist', 'hash', 'base', 'codec', ...TRANSFER_OPTIONS];
const RESTORE_OPTIONS = ['regions', 'live', 'verify', 'ram', 'verifyDigests', 'multipath', ...TRANSFER_OPTIONS];

/** How a region is named in transfer errors: its key, prefixed with its rank when there are several ranks. */
function regionLabel(rank: number, key: string, multiRank: boolean): string {
  return multiRank ? `rank ${rank}/${key}` : key;
}

function notDurable(snapshot: Snapshot, what: string): VsnapError {
  return new VsnapError(
    'E_NOT_DURABLE',
    `capture ${snapshot.id} of '${snapshot.name}' (persist 'async' or 'off') is not in the store yet, so ${what} ` +
      'needs the RAM tier that holds it. Pass that RamTier, or call snapshot.persist() first.',
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
  private readonly ramTier: RamTier | undefined;
  /** How a persist from the RAM tier writes the blobs (the capture's `codec`). */
  private readonly storeCodec: StoreCodec;
  private isDurable: boolean;
  private persisting: Promise<void> | undefined;
  private current: Manifest;

  private constructor(store: RegionStore, manifest: Manifest, lastCapture?: TransferSummary, ramTier?: RamTier, storeCodec: StoreCodec = 'off') {
    this.store = store;
    this.storeCodec = storeCodec;
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
    this.persisting ??= persistFromRamTier(this.store, this.current, this.ramTier!, options, this.storeCodec).then(
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

  /**
   * The current capture of `name` (or the one with `id`). Throws E_SNAPSHOT_NOT_FOUND. Only the
   * manifest is read: a `gc` (`vsnap rm`) may delete its blobs before a later restore reads them.
   * `restoreEngine` given a reference (`{ store, name }`) opens it under the store's lock, so none can.
   */
  static async open(store: RegionStore, name: string, options: { id?: string } = {}): Promise<Snapshot> {
    const snapshot = new Snapshot(store, await store.get(name, options.id));
    await pausePoint('snapshot.opened'); // the manifest read, its blobs not yet: a test runs a gc here
    return snapshot;
  }

  /**
   * Captures regions into the store under `name`: every region is copied out in chunks,
   * checksummed while streaming, and written as a blob; the manifest is published last, and
   * `current` then names this capture. Identical regions are stored once. With a `ram` tier, the
   * bytes land in it first, and `persist` says when the store gets them (a capture
   * persisted later becomes `current` only if no newer capture of `name` was published since).
   */
  static async capture(store: RegionStore, name: string, options: CaptureOptions): Promise<Snapshot> {
    validateName(name);
    checkOptions('Snapshot.capture options', options, CAPTURE_OPTIONS);
    checkCaptureRegions(options.regions);
    const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_SIZE;
    if (!Number.isSafeInteger(chunkSize) || chunkSize <= 0 || chunkSize % 4096 !== 0 || chunkSize > 2 ** 30) {
      invalidArgument('chunkSize', 'a positive multiple of 4096 up to 1 GiB', chunkSize);
    }
    const regions = options.regions;
    const total = regions.reduce((s, r) => s + r.size, 0);
    const { platform, gpus } = await platformOf(regions);

    const codec = checkStoreCodec(options.codec);
    const persist = options.persist ?? 'sync';
    if (persist !== 'sync' && persist !== 'async' && persist !== 'off') invalidArgument('persist', "'sync', 'async' or 'off'", persist);
    const ram = options.ram;
    if (persist !== 'sync' && !ram) invalidArgument('ram', `a RamTier: persist '${persist}' keeps the capture in the RAM tier`, ram);
    const hash = options.hash ?? (persist === 'sync' ? 'now' : 'deferred');
    if (hash !== 'now' && hash !== 'deferred') invalidArgument('hash', "'now' or 'deferred'", hash);
    if (hash === 'deferred' && persist === 'sync') invalidArgument('hash', "'now' with persist 'sync' (the store needs the checksums in the same pass); 'deferred' needs persist 'async' or 'off'", hash);
    const items = regions.map((r) => ({ rank: r.rank ?? 0, key: r.key, size: r.size }));
    const id = store.newCaptureId();
    const txn = persist === 'sync' ? await store.beginCapture(name, total, id) : undefined;
    let reservation: RamReservation | undefined;
    try {
      if (ram && (persist !== 'sync' || ram.fits(items))) reservation = ram.reserve(name, id, items);
      // After the free-space check and the reservation: nothing is read from a capture that cannot fit.
      const digestStarted = performance.now();
      const gpuDigests = await captureDigests(regions, chunkSize);
      const digestSeconds = (performance.now() - digestStarted) / 1000;
      // Deferred: the RAM copy is vouched for by the GPU digests, so every region needs one.
      const deferred = hash === 'deferred' && reservation !== undefined && gpuDigests.every((d) => d !== null);
      const base = options.base?.manifest.checksummed ? options.base.manifest : undefined; // a base not persisted has no blobs to share
      const reused = reservation || !txn ? new Map<number, RegionInfo>() : reusableRegions(store, base, regions, chunkSize, gpuDigests);
      const fresh = regions.map((_, i) => i).filter((i) => !reused.has(i));
      const multiRank = regions.some((x) => (x.rank ?? 0) > 0);
      // A coded RAM tier gets GPU regions coded on their GPU, unless the capture hashes on the host
      // without the store: that hash needs the raw bytes on the host (they are landed, then coded).
      let gpuCoded = reservation !== undefined && ram!.codec === 'vsnap-c1' && regions.every((r) => onDevice(r.memory)) && (txn !== undefined || deferred);
      const codedSources = regions.map((r, i) => ({ id: regionId(items[i]!.rank, r.key), size: r.size, chunkSize, memory: r.memory, ...(r.tensors ? { tensors: r.tensors } : {}) }));
      let landed: { linkBytes: number; seconds: number } | undefined;
      if (gpuCoded && !txn) {
        options.signal?.throwIfAborted();
        try {
          landed = await reservation!.landCoded(codedSources);
          options.onProgress?.({ phase: 'done', bytesDone: total, bytesTotal: total });
        } catch (err) {
          if (!scratchShortage(err)) throw err;
          gpuCoded = false; // lands raw below and is coded on the CPU
          process.emitWarning(`capture ${id} of '${name}': no GPU memory for the codec's scratch (${(err as Error).message}); it lands raw and is coded on the CPU`, { code: 'VSNAP_RAM_TIER' });
        }
      }
      const result = fresh.length === 0 || landed ? { checksums: [], seconds: landed?.seconds ?? 0 } : await runTransfer({
        op: 'capture',
        label: name,
        regions: fresh.map((i) => ({ i, r: regions[i]! })).map(({ i, r }) => ({
          name: regionLabel(r.rank ?? 0, r.key, multiRank),
          ...(txn ? { blobPath: txn.blobTmpPath(i) } : {}),
          size: r.size,
          chunkSize,
          memory: r.memory,
          ...(reservation && !gpuCoded ? { hostCopy: { kind: 'buffer' as const, buffer: reservation.buffer, offset: reservation.offsets.get(regionId(items[i]!.rank, r.key))! } } : {}),
        })),
        ...(deferred ? { hash: false } : {}),
        ...passOn(options),
      });
      failpoint('capture.after-transfer');
      const read = result.checksums ?? [];
      const checksums = regions.map((_, i) => (reused.has(i) ? [...reused.get(i)!.checksums] : deferred ? [] : read[fresh.indexOf(i)]!));
      const digests = regions.map((r, i) => reused.get(i)?.blob ?? (deferred ? '' : blobDigest(r.size, chunkSize, checksums[i]!)));
      const codecs = regions.map((_, i) => reused.get(i)?.codec); // a shared blob keeps its form
      let manifest = captureManifest({ id, name, regions, chunkSize, checksums, digests, gpuDigests, platform, gpus, options, deferred, codecs });
      if (txn && codec !== 'off') manifest = await codeCapturedBlobs(manifest, new Map(fresh.map((i) => [regionId(items[i]!.rank, items[i]!.key), txn.blobTmpPath(i)])));
      const stored = new Map([...manifest.regions()].map(({ rank, region }) => [regionId(rank, region.key), region]));
      let dedupedBytes = 0;
      const blobs = regions.map((r, i) => {
        const region = stored.get(regionId(items[i]!.rank, r.key))!;
        return { ...(reused.has(i) ? {} : { tmpPath: txn?.blobTmpPath(i) }), size: storedBytes(region), digest: region.blob };
      });
      if (txn) ({ dedupedBytes } = await txn.publish(manifest, blobs));
      if (txn && reservation) {
        // the store has it by now: a RAM tier that fails to code it only loses its copy
        try {
          if (gpuCoded) await reservation.landCoded(codedSources);
          else await reservation.code(manifest);
        } catch (err) {
          reservation.abandon(); // half packed: of no use; restores read the store
          reservation = undefined;
          process.emitWarning(`coding capture ${id} of '${name}' in the RAM tier failed: ${(err as Error).message}. The store holds it; the RAM tier does not.`, { code: 'VSNAP_RAM_TIER' });
        }
      } else if (reservation && !landed) {
        await reservation.code(manifest); // the RAM tier holds the only copy: a failure fails the capture
      }
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
      const snapshot = new Snapshot(store, manifest, summary, txn ? undefined : ram, codec);
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
  restore(options: RestoreOptions): Promise<TransferSummary> {
    return this.restoreInto(options, undefined);
  }

  /**
   * {@link Snapshot.restore} into targets whose memory is still being made: `options.regions` holds
   * only the regions of `staged.first`, copied at once; the others come with `staged.more` and
   * `staged.rest`. Not with `multipath`.
   * @internal
   */
  restoreStaged(options: RestoreOptions, staged: StagedTargets): Promise<TransferSummary> {
    return this.restoreInto(options, staged);
  }

  private async restoreInto(options: RestoreOptions, staged: StagedTargets | undefined): Promise<TransferSummary> {
    const manifest = this.current; // the one the bytes are restored by, even if a persist completes meanwhile
    if (!Array.isArray(options?.regions)) invalidArgument('regions', 'an array of restore targets', options?.regions);
    checkOptions('Snapshot.restore options', options, RESTORE_OPTIONS);
    // Every target by region id; with stages, the rest join once made (before any of them is copied or digested).
    const targets = new Map(options.regions.map((r) => [regionId(r.rank ?? 0, r.key), r]));
    const live = (ids?: ReadonlySet<string>) =>
      [...targets.entries()].filter(([id]) => !ids || ids.has(id)).map(([, r]) => ({ rank: r.rank ?? 0, key: r.key, size: r.size, memory: r.memory }));
    // A deferred capture's RAM copy was never hashed: its GPU digests are the one check it gets.
    const digesting = (options.verifyDigests ?? true) || !manifest.checksummed;
    // Every target but those of `ids`.
    const liveExcept = (ids: ReadonlySet<string>) => live().filter((l) => !ids.has(regionId(l.rank, l.key)));
    // From the RAM tier, the digest of the first regions copied runs while the rest are copied, and
    // the rest's digest is planned meanwhile (matching thousands of regions to the snapshot's takes
    // milliseconds): once the last byte has landed, only the tail's digest itself is left.
    let head: { ids: Set<string>; done: Promise<Awaited<ReturnType<typeof verifyRestoredByDevice>>>; tail: DigestPlan | undefined } | undefined;
    const onHead = digesting
      ? (ids: readonly string[]) => {
          const set = new Set(ids);
          const done = verifyRestoredByDevice(manifest, live(set));
          done.catch(() => undefined); // awaited below on every path
          // Every target is known by now (copyInStages calls this once the rest joined).
          head = { ids: set, done, tail: planVerify(manifest, liveExcept(set)) };
        }
      : undefined;
    let copied: Awaited<ReturnType<Snapshot['restoreBytes']>>;
    try {
      copied = await this.restoreBytes(options, targets, staged, onHead);
    } catch (err) {
      await head?.done.catch(() => undefined); // nothing reads the regions once the restore has failed
      throw err;
    }
    const waited = performance.now();
    const early = head ? await head.done : undefined;
    const headWait = (performance.now() - waited) / 1000;
    // Coded blobs decoded on the GPU were checked by nothing else: their GPU digest runs whatever verifyDigests says.
    const tail = await verifyPlanned(manifest, head ? head.tail : planVerify(manifest, live(), digesting || copied.decodedOnDevice === true));
    // The digest time the restore waited for: the tail's, and whatever of the head's outlasted the tail's copy.
    const digest = early || tail ? { seconds: headWait + (tail?.seconds ?? 0), devices: tail?.devices ?? early?.devices ?? [] } : undefined;
    const { devices: bytesByDevice, decodedOnDevice: _decoded, ...summary } = copied;
    const devices = (bytesByDevice ?? []).map((d): DeviceTiming => {
      const checked = digest?.devices.find((x) => x.device === d.device);
      return { device: d.device, bytes: d.bytes, hydrateSeconds: d.seconds, ...(checked ? { digestSeconds: headWait + checked.seconds } : {}) };
    });
    return {
      ...summary,
      ...(digest ? { digestSeconds: digest.seconds } : {}),
      ...(devices.length ? { devices } : {}),
    };
  }

  /** Checks the targets' layout against the manifest (every region, by rank and key, sizes and tags, and the facts given). */
  private checkTargets(regions: Iterable<RestoreRegion>, options: RestoreOptions): void {
    const byRank: LiveRegion[][] = [];
    for (const r of regions) {
      const rank = r.rank ?? 0;
      if (!Number.isInteger(rank) || rank < 0) invalidArgument('rank', 'an integer >= 0', r.rank);
      while (byRank.length <= rank) byRank.push([]);
      byRank[rank]!.push({ key: r.key, size: r.size, ...(r.tag !== undefined ? { tag: r.tag } : {}) });
    }
    this.manifest.assertCompatible({ ...(options.live ?? {}), ranks: byRank.map((regions) => ({ regions })) });
  }

  /**
   * With stages: the rest of the targets, joined to `targets` and checked with them once made. The
   * first part alone is checked region by region before anything is copied into it.
   */
  private joinStages(options: RestoreOptions, targets: Map<string, RestoreRegion>, stages: StagedTargets | undefined): Promise<StagedRest> | undefined {
    if (!stages) return undefined;
    if (options.multipath) invalidArgument('stages', 'no stages with multipath', stages);
    const sizes = new Map([...this.manifest.regions()].map(({ rank, region }) => [regionId(rank, region.key), region.size]));
    for (const [id, r] of targets) {
      if (!stages.first.has(id) || sizes.get(id) !== r.size) invalidArgument('regions', `regions of the snapshot, each of its size, all in stages.first (${id} is not)`, r.key);
    }
    const joined = stages.rest.then((rest) => {
      for (const r of rest.regions) targets.set(regionId(r.rank ?? 0, r.key), r);
      this.checkTargets(targets.values(), options);
      return rest;
    });
    joined.catch(() => undefined); // awaited by the copy on every path
    return joined;
  }

  private async restoreBytes(
    options: RestoreOptions,
    targets: Map<string, RestoreRegion>,
    stages: StagedTargets | undefined,
    onHead?: (ids: readonly string[]) => void,
  ): Promise<Omit<TransferSummary, 'devices'> & { devices?: NativeTransferResult['devices']; decodedOnDevice?: boolean }> {
    const staged = this.joinStages(options, targets, stages);
    if (!staged) this.checkTargets(options.regions, options);
    if (!this.isDurable && !options.ram?.has(this.id)) throw notDurable(this, 'a restore');
    const verify = options.verify ?? 'chunk';
    const multiRank = this.manifest.data.ranks.length > 1;
    if (verify !== 'chunk' && verify !== 'all-first') invalidArgument('verify', "'chunk' or 'all-first'", verify);
    const common = {
      label: this.name,
      ...passOn(options),
    };
    if (options.ram?.fits(this.manifest)) {
      const started = performance.now();
      const early = stages?.started;
      if (early && (early.snapshotId !== this.id || early.cache !== options.ram)) invalidArgument('stages.started', `a copy of capture ${this.id} from the RAM tier given`, early.snapshotId);
      const taken = early?.take(); // this restore finishes the copy and lets the lease go from here on
      const wasHeld = taken !== undefined || options.ram.has(this.id);
      if (staged && !wasHeld) await staged; // the rest checked before the RAM tier loads the snapshot from the store
      const lease = taken?.lease ?? (await options.ram.acquire(this.store, this.manifest, { ...common, directIo: options.directIo ?? false }));
      try {
        if (lease.chunks) {
          if (staged) await (await staged).late.after; // every target made (and woken where it must be) before the one copy
          const copied = await restoreCoded(this.manifest, lease, targets, common);
          const seconds = (performance.now() - started) / 1000;
          return { bytes: copied.bytes, seconds, bytesPerSecond: copied.bytes / Math.max(seconds, 1e-9), tier: wasHeld ? 'ram' : 'store', devices: copied.devices };
        }
        if (options.multipath) return await this.restoreMultipath(options.multipath, lease, targets, common, wasHeld, started);
        const all = [...this.manifest.regions()];
        const plan = ramCopyPlan(all, (id) => targets.get(id)!.memory, lease, multiRank, stages, staged);
        const result = await copyInStages(common, plan, all.reduce((n, x) => n + x.region.size, 0), onHead, taken?.copy);
        const seconds = wasHeld ? result.seconds : (performance.now() - started) / 1000;
        return { bytes: result.bytes, seconds, bytesPerSecond: result.bytes / Math.max(seconds, 1e-9), tier: wasHeld ? 'ram' : 'store', devices: result.devices };
      } catch (err) {
        await taken?.copy.abandon(); // idempotent: nothing of a copy taken over is left in flight on any path
        throw err;
      } finally {
        lease.release();
      }
    }
    if (staged) await (await staged).late.after; // from disk the wait costs little beside the read: one job, after it
    const result = await restoreFromStore(this.store, this.manifest, targets, common, { verifyFirst: verify === 'all-first', directIo: options.directIo ?? false });
    return { bytes: result.bytes, seconds: result.seconds, bytesPerSecond: result.bytes / Math.max(result.seconds, 1e-9), tier: 'store', devices: result.devices, decodedOnDevice: result.decodedOnDevice };
  }

  /**
   * Starts copying `regions` (the first part of a restore's targets, in memory made for them) from
   * the RAM tier now, before {@link Snapshot.restore} is called with them: pass the result to
   * {@link Snapshot.restoreStaged} as `started` (with `first` its ids), and the restore goes on with the copy. Undefined
   * where `cache` does not hold this capture. Where no restore takes it, abandon() it.
   * @internal
   */
  async startRestore(cache: RamTier, regions: readonly RestoreRegion[], options: TransferOptions = {}): Promise<EarlyRestore | undefined> {
    const manifest = this.current;
    if (!cache.has(this.id) || !cache.fits(manifest)) return undefined;
    const lease = await cache.acquire(this.store, manifest, {}); // held: a reference, nothing is read
    if (lease.chunks) {
      lease.release(); // held coded: the restore decodes it all at once
      return undefined;
    }
    try {
      const multiRank = manifest.data.ranks.length > 1;
      const info = new Map([...manifest.regions()].map(({ rank, region }) => [regionId(rank, region.key), { rank, region }]));
      const items = regions.map((r) => {
        const found = info.get(regionId(r.rank ?? 0, r.key));
        if (!found || found.region.size !== r.size) invalidArgument('regions', `regions of capture ${this.id}, each of its size`, r.key);
        return ramCopyItem(found.rank, found.region, lease, r.memory, multiRank);
      });
      const copy = startCopy({ label: this.name, ...passOn(options) }, items, manifest.totalBytes);
      return new EarlyRestore(this.id, cache, new Set(items.map((x) => x.id)), copy, lease);
    } catch (err) {
      lease.release();
      throw toVsnapError(err);
    }
  }

  private async restoreMultipath(
    multipath: MultipathOptions,
    lease: RamLease,
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
        memory: targets.get(regionId(rank, region.key))!.memory,
        source: { buffer: lease.buffer, offset: lease.offsets.get(regionId(rank, region.key))! },
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
