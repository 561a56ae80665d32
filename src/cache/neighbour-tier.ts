import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import { native } from '../native/index.js';
import { memoryDevice, toNativeMemory, type RegionMemory } from '../regions/memory.js';
import { verifyRestored } from '../digest/compare.js';
import { DeviceAllocation } from '../gpu/device-allocation.js';
import { regionId } from '../manifest/region-id.js';

/**
 * Options of {@link NeighbourTier.create}.
 * @public
 */
export interface NeighbourTierOptions {
  /** The GPU whose free memory holds parked weights (its ordinal in this process). */
  readonly device: number;
  /** The most bytes this tier may hold on that GPU (allocation granularity included). */
  readonly budgetBytes: number;
  /** Where the memory and copies come from (default: CUDA). Tests pass a host-memory one. @internal */
  readonly backend?: NeighbourBackend;
}

/** The memory and copies behind a NeighbourTier. @internal */
export interface NeighbourBackend {
  /** The GPU a region's memory is on, if known. */
  deviceOf(memory: RegionMemory): number | undefined;
  granularity(device: number): Promise<number>;
  allocate(device: number, size: number): Promise<{ readonly memory: RegionMemory; close(): void }>;
  /** Copies every pair on a stream of `device`. */
  copy(device: number, pairs: ReadonlyArray<{ src: RegionMemory; dst: RegionMemory; size: number }>): Promise<{ bytes: number; seconds: number }>;
}

/** GPU memory (VMM allocations) and peer copies (native/cuda/peer). */
const cudaBackend: NeighbourBackend = {
  deviceOf: memoryDevice,
  async granularity(device) {
    const info = (await native().cudaDevices(false)).find((d) => d.ordinal === device);
    if (!info) throw new VsnapError('E_INVALID_ARGUMENT', `there is no GPU ${device} in this process`);
    return info.vmmGranularity;
  },
  async allocate(device, size) {
    const allocation = await DeviceAllocation.allocate(device, size);
    return { memory: { kind: 'device', allocation }, close: () => allocation.close() };
  },
  async copy(device, pairs) {
    const r = await native().peerCopy({ device, pairs: pairs.map((p) => ({ src: toNativeMemory(p.src), dst: toNativeMemory(p.dst), size: p.size })) });
    return { bytes: r.bytes, seconds: r.seconds };
  },
};

/**
 * A region to park, or to restore into: the engine's memory (live regions, or tier-0 held
 * descriptors), by rank and key.
 * @public
 */
export interface NeighbourRegion {
  /** The engine rank (default 0). */
  readonly rank?: number;
  /** The region's key, as in the manifest. */
  readonly key: string;
  /** Bytes to copy. */
  readonly size: number;
  /** `device` or `imported` memory on a GPU other than the tier's. */
  readonly memory: RegionMemory;
}

/**
 * What a park or restore through the neighbour tier did.
 * @public
 */
export interface NeighbourTransfer {
  /** Bytes copied. */
  readonly bytes: number;
  /** Wall time of the peer copies. */
  readonly seconds: number;
  /** bytes / seconds. */
  readonly bytesPerSecond: number;
  /** restore: seconds spent on the GPU digest of the restored memory (when a manifest with digests was given). */
  readonly digestSeconds?: number;
}

interface Held {
  readonly id: string;
  readonly size: number;
  readonly memory: RegionMemory;
  close(): void;
}

interface Parked {
  readonly regions: readonly Held[];
  readonly bytes: number;
  /** Order of last use (park or restore): lower is older. */
  lastUse: number;
  /** Set by evict: a restore copying from it when it happened must not be trusted. */
  evicted: boolean;
}

/**
 * One entry of a {@link NeighbourTier}, as {@link NeighbourTier.entries} lists it.
 * @public
 */
export interface NeighbourEntry {
  /** What it is parked under (e.g. a snapshot id). */
  readonly id: string;
  /** Bytes it holds on the tier's GPU (allocation granularity included). */
  readonly bytes: number;
}

const ref = (rank: number | undefined, key: string): string => regionId(rank ?? 0, key);

/**
 * The neighbour-GPU tier: a suspended engine's weights parked in another GPU's free memory and
 * restored from there by peer copy (NVLink: about 7x a PCIe link), between tier 0 (the engine's
 * own GPU) and the RAM tier. Parked copies live in VMM allocations on the neighbour, within a
 * byte budget; a restore is verified with the GPU digest against the snapshot's manifest.
 * Holds GPU memory until {@link NeighbourTier.evict} or {@link NeighbourTier.close}.
 * @public
 */
export class NeighbourTier {
  private readonly parked = new Map<string, Parked>();
  private used = 0;
  private isClosed = false;
  private uses = 0;

  private constructor(
    /** The GPU holding the parked weights. */
    readonly device: number,
    /** The tier's byte budget. */
    readonly budgetBytes: number,
    private readonly backend: NeighbourBackend,
  ) {}

  /** A tier on `options.device`; allocates nothing until {@link NeighbourTier.park}. */
  static create(options: NeighbourTierOptions): NeighbourTier {
    if (!Number.isInteger(options?.device) || options.device < 0) invalidArgument('device', 'a GPU ordinal (integer >= 0)', options?.device);
    if (!Number.isSafeInteger(options.budgetBytes) || options.budgetBytes <= 0) invalidArgument('budgetBytes', 'a positive integer byte count', options.budgetBytes);
    return new NeighbourTier(options.device, options.budgetBytes, options.backend ?? cudaBackend);
  }

  /** Bytes held now. */
  get usedBytes(): number {
    return this.used;
  }
  /** Whether {@link NeighbourTier.close} was called. */
  get closed(): boolean {
    return this.isClosed;
  }
  /** Whether weights are parked under `id` (e.g. a snapshot id). */
  has(id: string): boolean {
    return this.parked.has(id);
  }
  /** The ids parked now. */
  ids(): string[] {
    return [...this.parked.keys()];
  }
  /** What is parked now, least recently used (parked or restored) first. */
  entries(): NeighbourEntry[] {
    return [...this.parked].sort(([, a], [, b]) => a.lastUse - b.lastUse).map(([id, p]) => ({ id, bytes: p.bytes }));
  }

  /**
   * The bytes `regions` would take in this tier (each region rounded up to the GPU's allocation
   * granularity), so a caller can make room before {@link NeighbourTier.park}.
   */
  async footprint(regions: ReadonlyArray<{ readonly size: number }>): Promise<number> {
    this.live();
    const granularity = await this.granularity();
    return regions.reduce((s, r) => s + Math.ceil(r.size / granularity) * granularity, 0);
  }

  /**
   * Copies `regions` into new allocations on the tier's GPU, under `id`. Throws E_NO_SPACE when
   * they do not fit the budget (nothing is allocated), E_PEER_UNSUPPORTED when the GPUs cannot
   * copy to each other. With `manifest`, the parked copy is digested on the neighbour and
   * compared with the snapshot's digests (E_DIGEST_MISMATCH; nothing is kept). With `makeRoom`,
   * the least recently used entries are evicted first until it fits. On failure everything
   * allocated for it is freed.
   */
  async park(id: string, regions: readonly NeighbourRegion[], options: { manifest?: Manifest; makeRoom?: boolean } = {}): Promise<NeighbourTransfer> {
    this.live();
    if (typeof id !== 'string' || id === '') invalidArgument('id', 'a non-empty string', id);
    if (this.parked.has(id)) throw new VsnapError('E_BUSY', `'${id}' is already parked in the neighbour tier on GPU ${this.device}; evict it first`);
    const devices = new Set(regions.map((r) => this.sourceDevice(r)));
    if (devices.size !== 1) invalidArgument('regions', 'regions on one GPU', [...devices]);
    const source = [...devices][0]!;
    const bytes = await this.footprint(regions);
    if (options.makeRoom && bytes <= this.budgetBytes) {
      for (const old of this.entries()) {
        if (this.used + bytes <= this.budgetBytes) break;
        this.evict(old.id);
      }
    }
    if (this.used + bytes > this.budgetBytes) {
      throw new VsnapError('E_NO_SPACE', `parking '${id}' needs ${bytes} bytes on GPU ${this.device}; the neighbour tier holds ${this.used} of its ${this.budgetBytes}. Evict something or raise budgetBytes.`, {
        id, bytes, used: this.used, budgetBytes: this.budgetBytes,
      });
    }
    this.used += bytes; // reserved now, so concurrent parks cannot both fit
    const held: Held[] = [];
    try {
      for (const r of regions) held.push({ id: ref(r.rank, r.key), size: r.size, ...(await this.call(() => this.backend.allocate(this.device, r.size))) });
      const result = await this.copy(source, regions.map((r, i) => ({ src: r.memory, dst: held[i]!.memory, size: r.size })));
      if (options.manifest) {
        await verifyRestored(options.manifest, regions.map((r, i) => ({ rank: r.rank ?? 0, key: r.key, size: r.size, memory: held[i]!.memory })));
      }
      this.live(); // closed while copying: close() freed nothing of this, so free it here
      this.parked.set(id, { regions: held, bytes, lastUse: ++this.uses, evicted: false });
      return result;
    } catch (err) {
      for (const h of held) h.close();
      this.used -= bytes;
      throw toVsnapError(err);
    }
  }

  /**
   * Copies the weights parked under `id` back into `regions` (matched by rank and key) by peer
   * copy on the target GPU. With `manifest` (and `verifyDigests`, default true), the restored
   * memory is digested on the target and compared with the snapshot's digests
   * (E_DIGEST_MISMATCH). The parked copy stays until evicted. An eviction (or close) while it
   * runs makes it fail with E_SNAPSHOT_NOT_FOUND (`details.evicted`), whatever the copy did: the
   * caller restores from another tier. (Memory a running copy uses stays allocated until the copy
   * ends: the native side holds it.)
   */
  async restore(id: string, regions: readonly NeighbourRegion[], options: { manifest?: Manifest; verifyDigests?: boolean } = {}): Promise<NeighbourTransfer> {
    this.live();
    const entry = this.parked.get(id);
    if (!entry) throw new VsnapError('E_SNAPSHOT_NOT_FOUND', `'${id}' is not parked in the neighbour tier on GPU ${this.device}`, { id });
    const byRef = new Map(entry.regions.map((h) => [h.id, h]));
    const missing = regions.filter((r) => byRef.get(ref(r.rank, r.key))?.size !== r.size).map((r) => ref(r.rank, r.key));
    if (missing.length || regions.length !== entry.regions.length) {
      throw new VsnapError('E_MANIFEST_MISMATCH', `the regions to restore do not match what is parked under '${id}' (${missing.length ? `unknown or resized: ${missing.slice(0, 5).join(', ')}` : `${regions.length} given, ${entry.regions.length} parked`})`, { id, missing });
    }
    const devices = new Set(regions.map((r) => this.sourceDevice(r)));
    if (devices.size !== 1) invalidArgument('regions', 'regions on one GPU', [...devices]);
    const target = [...devices][0]!;
    entry.lastUse = ++this.uses;
    let result: NeighbourTransfer;
    try {
      result = await this.copy(target, regions.map((r) => ({ src: byRef.get(ref(r.rank, r.key))!.memory, dst: r.memory, size: r.size })));
    } catch (err) {
      if (entry.evicted) throw this.evictedError(id, err);
      throw err;
    }
    if (entry.evicted) throw this.evictedError(id);
    if (!options.manifest) return result;
    const digestSeconds = await verifyRestored(options.manifest, regions.map((r) => ({ rank: r.rank ?? 0, key: r.key, size: r.size, memory: r.memory })), options.verifyDigests ?? true);
    return digestSeconds === undefined ? result : { ...result, digestSeconds };
  }

  /** Frees what is parked under `id`. Returns whether there was anything. */
  evict(id: string): boolean {
    const entry = this.parked.get(id);
    if (!entry) return false;
    entry.evicted = true;
    for (const h of entry.regions) h.close();
    this.parked.delete(id);
    this.used -= entry.bytes;
    return true;
  }

  /** Frees everything parked. Idempotent. */
  close(): void {
    for (const id of [...this.parked.keys()]) this.evict(id);
    this.isClosed = true;
  }

  /** Same as {@link NeighbourTier.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  private evictedError(id: string, cause?: unknown): VsnapError {
    return new VsnapError(
      'E_SNAPSHOT_NOT_FOUND',
      `'${id}' was evicted from the neighbour tier on GPU ${this.device} while it was being restored; restore it from another tier (RAM or the store)`,
      { id, evicted: true },
      cause === undefined ? {} : { cause },
    );
  }

  private live(): void {
    if (this.isClosed) throw new VsnapError('E_CLOSED', 'this NeighbourTier was closed');
  }

  private sourceDevice(r: NeighbourRegion): number {
    const d = this.backend.deviceOf(r.memory);
    if (d === undefined) invalidArgument(`regions['${r.key}'].memory`, "GPU memory ('device', or 'imported' with its device)", r.memory.kind);
    if (d === this.device) invalidArgument(`regions['${r.key}'].memory`, `memory on a GPU other than the tier's (${this.device})`, d);
    return d;
  }

  private granularity(): Promise<number> {
    return this.call(() => this.backend.granularity(this.device));
  }

  private async copy(device: number, pairs: ReadonlyArray<{ src: RegionMemory; dst: RegionMemory; size: number }>): Promise<NeighbourTransfer> {
    const r = await this.call(() => this.backend.copy(device, pairs));
    return { bytes: r.bytes, seconds: r.seconds, bytesPerSecond: r.bytes / Math.max(r.seconds, 1e-9) };
  }

  private async call<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw toVsnapError(err);
    }
  }
}

/**
 * Where and whether a suspend parks the engine's weights in a neighbour GPU.
 * @public
 */
export interface NeighbourParkOptions {
  /** The tier to park in. */
  readonly tier: NeighbourTier;
  /**
   * Asked with the bytes the park would take before anything is copied: false skips the park
   * (the controller uses it to keep within the neighbour GPU's budget, evicting older entries
   * first). Default: always park (evicting the tier's least recently used entries to fit).
   */
  readonly admit?: (bytes: number) => boolean;
}

/**
 * What a park before the sleep did.
 * @public
 */
export interface NeighbourParkResult {
  /** The GPU the weights are parked on. */
  readonly device: number;
  /** Bytes held there (allocation granularity included). */
  readonly bytes: number;
  /** Seconds the copy and its verification took (0 when they were parked already). */
  readonly seconds: number;
  /** Whether this snapshot's weights were parked already (nothing copied). */
  readonly already: boolean;
}

