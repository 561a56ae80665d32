import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { native, type NativeRegionSet } from '../native/index.js';
import type { RegionMemory } from './memory.js';

/**
 * Regions mapped into this process once, for several operations in a row: the hydrate of a
 * restore and the GPU digest that verifies it, or the dirty check of a suspend and the capture
 * after it. Host memory (`host`) is mmapped and exported GPU memory (`imported`) is imported and
 * mapped, all in one call on a few threads; {@link MappedRegions.memory} then names region `i`
 * for any transfer or digest, which uses the mapping instead of making its own.
 *
 * A mapping keeps the exporter's physical memory alive: close the set before the exporter frees
 * that memory (an engine's sleep), or the GPU memory stays allocated until it is closed.
 * Descriptors are duplicated while opening; the caller may close its own once `open` resolves.
 *
 * By default exported GPU memory is mapped in the batched form: every allocation is imported,
 * then one address reservation and one access call cover all of a device's allocations (instead
 * of one of each per region); should that fail, the regions are mapped one at a time.
 * @public
 */
export class MappedRegions {
  /** How many regions the set holds. */
  readonly count: number;
  /** How the regions were mapped: `batched` (one reservation and access call per device) or `per-region`. */
  readonly mapping: 'batched' | 'per-region' | 'pipelined';
  private set: NativeRegionSet | undefined;
  private closing: Promise<void> | undefined;
  private readonly sources: ReadonlyArray<RegionMemory>;
  /** Per region, its index in the native set (-1: passed through). */
  private readonly slots: number[];

  private constructor(set: NativeRegionSet, sources: ReadonlyArray<RegionMemory>) {
    this.set = set;
    this.sources = sources;
    this.count = sources.length;
    this.mapping = set.pipelined ? 'pipelined' : set.batched ? 'batched' : 'per-region';
    let n = 0;
    this.slots = sources.map((s) => (mappable(s) ? n++ : -1));
  }

  /**
   * Maps every `host` and `imported` region of the list (other kinds are passed through: device
   * memory this process allocated is mapped already). Nothing stays mapped when it fails.
   */
  static async open(regions: ReadonlyArray<{ readonly memory: RegionMemory; readonly size: number }>, options: MappedRegionsOptions = {}): Promise<MappedRegions> {
    const specs: Array<{ kind: 'host' | 'imported'; fd: number; size: number; device?: number }> = [];
    const sources = regions.map((r) => r.memory);
    for (const r of regions) {
      const m = r.memory;
      if (mappable(m)) specs.push({ kind: m.kind, fd: m.fd, size: r.size, ...(m.kind === 'imported' && m.device !== undefined ? { device: m.device } : {}) });
    }
    let set: NativeRegionSet;
    try {
      set = await native().openRegions(specs, options.threads, options.mapping ?? 'auto');
    } catch (err) {
      throw toVsnapError(err);
    }
    return new MappedRegions(set, sources);
  }

  /**
   * Resolves once every region is mapped: at once, unless the set is `pipelined`; then it
   * rejects with the error that stopped the mapping (a transfer into a region that could not be
   * mapped fails with that error too).
   */
  async settled(): Promise<void> {
    if (!this.set) throw new VsnapError('E_CLOSED', 'these MappedRegions were closed');
    try {
      await this.set.settled();
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  /** Whether {@link MappedRegions.close} was called. */
  get closed(): boolean {
    return this.set === undefined;
  }

  /**
   * The memory of region `i` (in the order given to {@link MappedRegions.open}) through this
   * set's mapping. Throws E_CLOSED after close.
   */
  memory(i: number): RegionMemory {
    const source = this.sources[i];
    if (source === undefined) invalidArgument('i', `a region index below ${this.count}`, i);
    if (!mappable(source)) return source;
    if (!this.set) throw new VsnapError('E_CLOSED', 'these MappedRegions were closed');
    const index = this.slots[i]!;
    return { kind: 'mapped', source: source.kind, set: this.set, index, ...(source.kind === 'imported' && source.device !== undefined ? { device: source.device } : {}) };
  }

  /**
   * Unmaps every region, off the JS thread; resolves when done (a transfer still using some
   * keeps those until it ends). Safe to call more than once.
   */
  close(): Promise<void> {
    if (!this.closing) {
      const set = this.set!;
      this.set = undefined;
      this.closing = set.release().catch((err: unknown) => {
        throw toVsnapError(err);
      });
    }
    return this.closing;
  }

  /** Same as {@link MappedRegions.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * Options of {@link MappedRegions.open}.
 * @public
 */
export interface MappedRegionsOptions {
  /** Threads that import and map (default 4, fewer for small sets). */
  readonly threads?: number;
  /**
   * `auto` (default): batched, falling back to one region at a time if the batched form fails;
   * `batched`: batched only; `per-region`: one reservation, mapping and access call per region;
   * `pipelined`: `open` resolves at once and the regions are mapped in order in the background,
   * in batched chunks, so a restore's copy starts on the first regions while the others are
   * still being mapped (needs every imported region's `device`, else it is `batched`; see
   * {@link MappedRegions.settled}).
   */
  readonly mapping?: 'auto' | 'batched' | 'per-region' | 'pipelined';
}

function mappable(m: RegionMemory): m is Extract<RegionMemory, { kind: 'host' | 'imported' }> {
  return m.kind === 'host' || m.kind === 'imported';
}
