import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { cudaStatus } from '../gpu/cuda.js';
import type { Manifest } from '../manifest/manifest.js';
import { native, type NativeHostBuffer } from '../native/index.js';
import type { RegionStore } from '../store/region-store.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { Arena } from './arena.js';
import { captureCoded, codeInPlace, loadCoded, loadDecoded, type CodedSource, type CodeItem, type HeldChunk } from './coded-tier.js';
import { regionId } from '../manifest/region-id.js';

/**
 * Options of {@link RamTier.create}.
 * @public
 */
export interface RamTierOptions {
  /** Bytes of host RAM the cache may hold (allocated, faulted in and pinned once, at create). */
  readonly budgetBytes: number;
  /** Page-lock the memory for DMA: default true when CUDA is available. Needs a GPU. */
  readonly pin?: boolean;
  /**
   * How snapshots are held: `vsnap-c1` codes each chunk that shrinks (docs/compression.md; BF16
   * weights to about 0.70 of their size), `off` (default) holds the raw bytes. A capture of GPU
   * memory is coded on its GPU before its bytes leave the card (fewer bytes cross the link), unless
   * it hashes on the host without persisting to the store (persist `async` or `off` with hash
   * `now`); that one, a capture of host memory, and a load of raw store blobs are coded on the CPU
   * once landed. Coded store blobs load as they are stored (each chunk decoded once to check it, not
   * coded again). A restore into GPU memory decodes on the GPU (docs/compression.md).
   */
  readonly codec?: 'vsnap-c1' | 'off';
}

/**
 * A snapshot held in the RAM tier.
 * @public
 */
export interface RamEntry {
  /** The snapshot's name. */
  readonly name: string;
  /** The capture's id. */
  readonly id: string;
  /** Bytes of the RAM tier it occupies. */
  readonly bytes: number;
  /** When a restore last used it (ms since the epoch). */
  readonly lastUsed: number;
  /**
   * Whether the store holds it too. The RAM tier never evicts a capture it holds the only copy
   * of (one made with persist `async` that is still being written, or `off`) to make room.
   */
  readonly durable: boolean;
}

/** @internal */
export interface RamLease {
  readonly buffer: NativeHostBuffer;
  /** Where each region starts in the buffer, by `${rank}/${key}`. */
  readonly offsets: ReadonlyMap<string, number>;
  /** Held coded (RamTierOptions.codec): each region's chunks, by `${rank}/${key}`; `offsets` then mean nothing. */
  readonly chunks?: ReadonlyMap<string, readonly HeldChunk[]>;
  release(): void;
}

/** Room taken in the RAM tier for a capture: filled by the capture, then committed or abandoned. @internal */
export interface RamReservation extends RamLease {
  /** The capture is complete: restores may use it (`durable`: the store holds it too). */
  commit(durable: boolean): void;
  /** Codes the landed raw bytes in place on the CPU where the cache codes (before commit). */
  code(manifest: Manifest): Promise<void>;
  /**
   * Lands the capture coded on the GPU instead of raw (before commit; the cache codes): each chunk of
   * the GPU regions encoded on its GPU while the previous one's coded bytes cross. Returns the
   * bytes that crossed the link.
   */
  landCoded(sources: readonly CodedSource[]): Promise<{ linkBytes: number; seconds: number }>;
  /** The capture failed: give the room back. */
  abandon(): void;
}

/** A region's place in a snapshot: what the RAM tier lays out. @internal */
export interface RamItem {
  readonly rank: number;
  readonly key: string;
  readonly size: number;
}

interface Entry {
  name: string;
  id: string;
  bytes: number;
  offset: number;
  offsets: Map<string, number>;
  chunks?: Map<string, HeldChunk[]>;
  lastUsed: number;
  users: number;
  ready: Promise<void>;
  loaded: boolean;
  durable: boolean;
}

function itemsOf(source: Manifest | readonly RamItem[]): readonly RamItem[] {
  if (Array.isArray(source)) return source as readonly RamItem[];
  return [...(source as Manifest).regions()].map(({ rank, region }) => ({ rank, key: region.key, size: region.size }));
}

/**
 * The RAM tier: snapshots held in host memory that is allocated and page-locked once, so a
 * restore from it is a bulk DMA straight to the GPU at the PCIe line rate, with no staging copy
 * and no hashing (every chunk was verified when it was loaded). Least recently used snapshots
 * are evicted when a new one needs room. Pass it to {@link Snapshot.restore} as `ram`, and to
 * {@link Snapshot.capture} to land a capture here first (the GPU is then free at D2H speed).
 * Holds its memory (and, when pinned, a CUDA context on GPU 0) until {@link RamTier.close}.
 * Child processes do not inherit the memory (a spawn does not copy the pinned pages).
 * @public
 */
export class RamTier {
  /** Bytes of host memory held. */
  readonly budgetBytes: number;
  /** Whether the memory is page-locked for DMA. */
  readonly pinned: boolean;
  /** How snapshots are held ({@link RamTierOptions.codec}). */
  readonly codec: 'vsnap-c1' | 'off';
  private readonly buffer: NativeHostBuffer;
  private readonly arena: Arena;
  private readonly byId = new Map<string, Entry>();
  private closed = false;

  private constructor(buffer: NativeHostBuffer, budgetBytes: number, codec: 'vsnap-c1' | 'off') {
    this.buffer = buffer;
    this.codec = codec;
    this.budgetBytes = budgetBytes;
    this.pinned = buffer.pinned;
    this.arena = new Arena(budgetBytes);
  }

  /** Allocates, faults in and (by default, with a GPU) pins `budgetBytes`: 0.08 s/GiB or so, once. */
  static async create(options: RamTierOptions): Promise<RamTier> {
    const budget = options?.budgetBytes;
    if (!Number.isSafeInteger(budget) || budget <= 0) invalidArgument('budgetBytes', 'a positive integer byte count', budget);
    for (const k of Object.keys(options)) if (k !== 'budgetBytes' && k !== 'pin' && k !== 'codec') invalidArgument('options', 'budgetBytes, pin and codec only', k);
    const codec = options.codec ?? 'off';
    if (codec !== 'vsnap-c1' && codec !== 'off') invalidArgument('codec', "'vsnap-c1' or 'off'", codec);
    const pin = options.pin ?? (await cudaStatus()).available;
    try {
      return new RamTier(await native().createHostBuffer(budget, pin ? 0 : -1), budget, codec);
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  /** Bytes held by cached snapshots. */
  get usedBytes(): number {
    return this.arena.usedBytes;
  }

  /** The snapshots held, most recently used first. */
  get entries(): RamEntry[] {
    return [...this.byId.values()]
      .filter((e) => e.loaded)
      .sort((a, b) => b.lastUsed - a.lastUsed)
      .map(({ name, id, bytes, lastUsed, durable }) => ({ name, id, bytes, lastUsed, durable }));
  }

  /** Whether a capture (by manifest id) is held and ready. */
  has(id: string): boolean {
    return this.byId.get(id)?.loaded === true;
  }

  /**
   * Reads a snapshot's blobs into the cache, verifying every chunk, evicting least recently
   * used snapshots as needed. Does nothing if it is already held. Throws E_NO_SPACE if it can
   * never fit (larger than the budget, or the rest is in use).
   */
  async load(store: RegionStore, manifest: Manifest, options: TransferOptions = {}): Promise<void> {
    const lease = await this.acquire(store, manifest, options);
    lease.release();
  }

  /**
   * Holds a snapshot in the cache for the duration of a restore (loading it first if needed).
   * @internal
   */
  async acquire(store: RegionStore, manifest: Manifest, options: TransferOptions = {}): Promise<RamLease> {
    this.checkOpen();
    let entry = this.byId.get(manifest.id);
    if (!entry && !manifest.checksummed) {
      // A capture with its hash deferred exists only here until persisted: nothing to load it from.
      throw new VsnapError('E_NOT_DURABLE', `capture ${manifest.id} of '${manifest.name}' is not in the store yet, and the RAM tier no longer holds it (evicted or closed). Capture it again.`, {
        name: manifest.name,
        id: manifest.id,
      });
    }
    if (!entry) entry = this.startLoad(store, manifest, options);
    entry.users++;
    try {
      await entry.ready;
    } catch (err) {
      entry.users--;
      throw err;
    }
    entry.lastUsed = Date.now();
    return this.leaseOf(entry);
  }

  /**
   * Holds a capture that is in the cache already (a RAM-tier-only capture being persisted), or
   * returns undefined when it is not. @internal
   */
  hold(id: string): RamLease | undefined {
    const entry = this.byId.get(id);
    if (this.closed || !entry?.loaded) return undefined;
    entry.users++;
    return this.leaseOf(entry);
  }

  /**
   * Takes room for a capture about to land here (evicting least recently used snapshots the
   * store also holds). Throws E_NO_SPACE when it cannot fit. @internal
   */
  reserve(name: string, id: string, items: readonly RamItem[]): RamReservation {
    this.checkOpen();
    const { bytes, offsets } = this.layout(items);
    if (bytes > this.budgetBytes) throw this.tooLarge(name, bytes);
    const base = this.place(bytes);
    for (const [k, v] of offsets) offsets.set(k, base + v);
    const entry: Entry = { name, id, bytes, offset: base, offsets, lastUsed: Date.now(), users: 1, loaded: false, durable: false, ready: Promise.resolve() };
    this.byId.set(id, entry);
    const lease = this.leaseOf(entry);
    return {
      ...lease,
      code: async (manifest) => {
        if (this.codec === 'off') return;
        await this.codeEntry(entry, manifest);
      },
      landCoded: async (sources) => {
        if (this.codec === 'off') throw new VsnapError('E_INTERNAL', 'landCoded on a RAM tier that does not code');
        const { chunks, bytes, linkBytes, seconds } = await captureCoded(this.buffer, base, base + entry.bytes, sources);
        entry.chunks = chunks;
        entry.bytes = bytes;
        this.arena.shrink(base, bytes);
        return { linkBytes, seconds };
      },
      commit: (durable) => {
        entry.loaded = true;
        entry.durable = durable;
        entry.lastUsed = Date.now();
        lease.release();
      },
      abandon: () => {
        lease.release();
        if (this.byId.get(id) === entry) this.byId.delete(id);
        if (!this.closed) this.arena.free(base);
      },
    };
  }

  /** The store now holds this capture too: it may be evicted like any other. @internal */
  markDurable(id: string): void {
    const entry = this.byId.get(id);
    if (entry) entry.durable = true;
  }

  private leaseOf(entry: Entry): RamLease {
    let released = false;
    return {
      buffer: this.buffer,
      offsets: entry.offsets,
      ...(entry.chunks ? { chunks: entry.chunks } : {}),
      release: () => {
        if (!released) {
          released = true;
          entry.users--;
        }
      },
    };
  }

  /** Whether the snapshot could be held at all. @internal */
  fits(manifest: Manifest | readonly RamItem[]): boolean {
    return this.layout(itemsOf(manifest)).bytes <= this.budgetBytes;
  }

  /**
   * Drops a snapshot from the cache (not while a restore uses it). Returns whether it was held.
   * A capture the store does not hold (persist `off`, or `async` not yet written) is gone after
   * this.
   */
  evict(id: string): boolean {
    const e = this.byId.get(id);
    if (!e || e.users > 0) return false;
    this.byId.delete(id);
    this.arena.free(e.offset);
    return true;
  }

  /** Drops every snapshot not in use that the store also holds (see {@link RamEntry.durable}). */
  clear(): void {
    for (const [id, e] of [...this.byId]) if (e.durable) this.evict(id);
  }

  /** Frees (and unpins) the memory once running restores are done with it. Idempotent. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.byId.clear();
    this.buffer.close();
  }

  /** Same as {@link RamTier.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  private checkOpen(): void {
    if (this.closed) throw new VsnapError('E_CLOSED', 'this RamTier was closed');
  }

  private layout(items: readonly RamItem[]): { bytes: number; offsets: Map<string, number> } {
    const offsets = new Map<string, number>();
    let bytes = 0;
    for (const { rank, key, size } of items) {
      offsets.set(regionId(rank, key), bytes);
      bytes += Math.ceil(size / 4096) * 4096;
    }
    return { bytes, offsets };
  }

  /** An entry's regions where they lie in its raw layout, in that order. */
  private itemsAt(entry: Entry, manifest: Manifest): CodeItem[] {
    return [...manifest.regions()]
      .map(({ rank, region }) => ({ id: regionId(rank, region.key), offset: entry.offsets.get(regionId(rank, region.key))!, region }))
      .sort((a, b) => a.offset - b.offset);
  }

  /** Codes a landed entry in place and gives the room it no longer needs back to the arena. */
  private async codeEntry(entry: Entry, manifest: Manifest): Promise<void> {
    this.holdCoded(entry, await codeInPlace(this.buffer, entry.offset, this.itemsAt(entry, manifest)));
  }

  /** The entry now holds these coded chunks: the room past them goes back to the arena. */
  private holdCoded(entry: Entry, coded: { chunks: Map<string, HeldChunk[]>; bytes: number }): void {
    entry.chunks = coded.chunks;
    entry.bytes = coded.bytes;
    this.arena.shrink(entry.offset, coded.bytes);
  }

  private tooLarge(name: string, bytes: number): VsnapError {
    return new VsnapError('E_NO_SPACE', `snapshot '${name}' (${bytes} bytes) is larger than the RAM tier (${this.budgetBytes} bytes)`, {
      budgetBytes: this.budgetBytes,
      neededBytes: bytes,
    });
  }

  private place(bytes: number): number {
    for (;;) {
      const offset = this.arena.allocate(bytes);
      if (offset !== undefined) return offset;
      const victim = [...this.byId.values()].filter((e) => e.loaded && e.durable && e.users === 0).sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!victim) {
        throw new VsnapError(
          'E_NO_SPACE',
          `the RAM tier (${this.budgetBytes} bytes) has no room for ${bytes} bytes: the rest is in use by running restores, loads or captures, ` +
            'or holds captures not yet persisted (Snapshot.persist, or RamTier.evict to discard one)',
          { budgetBytes: this.budgetBytes, neededBytes: bytes },
        );
      }
      this.evict(victim.id);
    }
  }

  private startLoad(store: RegionStore, manifest: Manifest, options: TransferOptions): Entry {
    const { bytes, offsets } = this.layout(itemsOf(manifest));
    if (bytes > this.budgetBytes) throw this.tooLarge(manifest.name, bytes);
    const base = this.place(bytes);
    for (const [k, v] of offsets) offsets.set(k, base + v);
    const entry: Entry = { name: manifest.name, id: manifest.id, bytes, offset: base, offsets, lastUsed: Date.now(), users: 0, loaded: false, durable: true, ready: Promise.resolve() };
    this.byId.set(manifest.id, entry);
    const coded = [...manifest.regions()].some(({ region }) => region.codec !== undefined);
    // Coded blobs into a tier that codes: held as stored (checked, not coded again); else raw, coded after.
    const asStored = coded && this.codec !== 'off';
    entry.ready = store
      .withLock(false, async (): Promise<unknown> => {
        if (asStored) return this.holdCoded(entry, await loadCoded(store, this.buffer, base, this.itemsAt(entry, manifest), manifest.name));
        return coded ? loadDecoded(store, this.buffer, this.itemsAt(entry, manifest), manifest.name) : runTransfer({
          op: 'hydrate',
          label: manifest.name,
          regions: [...manifest.regions()].map(({ rank, region }) => ({
            name: region.key,
            blobPath: store.blobPath(region.blob),
            size: region.size,
            chunkSize: region.chunkSize,
            checksums: region.checksums,
            memory: { kind: 'buffer' as const, buffer: this.buffer, offset: offsets.get(regionId(rank, region.key))! },
          })),
          ...options,
        });
      })
      .then(async () => {
        if (this.codec !== 'off' && !asStored) await this.codeEntry(entry, manifest);
      })
      .then(
        () => {
          entry.loaded = true;
        },
        (err: unknown) => {
          this.byId.delete(manifest.id);
          this.arena.free(base);
          throw toVsnapError(err);
        },
      );
    return entry;
  }
}
