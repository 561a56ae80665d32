import { native } from '../native/index.js';
import { stagingIdleMs } from '../settings.js';

// The CUDA contexts of the GPUs that transfers and digests touch, kept between operations.
//
// The addon retains a device's primary context only while something of its own needs it. A GPU
// that nothing else holds (with tensor parallelism: every GPU but the one the RAM tier is pinned
// with) would otherwise get a fresh context for each operation and lose it at the end: a TP=2
// restore created and destroyed GPU 1's context twice (hydrate, then the digest check), about
// 0.1-0.3 s each way, which cost more than moving its 6 GiB. Devices are kept while in use and
// for an idle period after (VSNAP_STAGING_IDLE_MS, like the staging pools), and
// releaseIdleResources() lets go of idle ones at once, so an idle SDK still holds no context.

/** How contexts are kept and let go (the addon's; a test passes its own recorder). @internal */
export interface ContextOps {
  keep(device: number): Promise<void>;
  release(device: number): Promise<void>;
}

interface Entry {
  kept: Promise<boolean>;
  /** Set once the keep settled: false when the context could not be made. */
  ok?: boolean;
  users: number;
  timer?: NodeJS.Timeout;
}

/** @internal */
export class DeviceContexts {
  private readonly entries = new Map<number, Entry>();

  constructor(
    private readonly ops: ContextOps = { keep: async (d) => native().cudaKeepContext(d), release: async (d) => native().cudaReleaseContext(d) },
    /** The idle period; unset: $VSNAP_STAGING_IDLE_MS, read at each use. */
    private readonly idleMs?: number,
  ) {}

  /**
   * Runs `use` with the context of every device in `devices` kept (made alongside it, once, for
   * a device not kept yet). A context that cannot be made is not an error here: the operation
   * itself meets the device and reports why.
   */
  async use<T>(devices: Iterable<number | undefined>, use: () => Promise<T>): Promise<T> {
    const idleMs = this.idleMs ?? stagingIdleMs(); // a bad value fails here, before anything is kept
    const list = [...new Set([...devices].filter((d): d is number => Number.isInteger(d) && d! >= 0))].sort((a, b) => a - b);
    const held: Entry[] = [];
    for (const d of list) {
      let entry = this.entries.get(d);
      if (!entry) {
        const made: Entry = { kept: Promise.resolve(false), users: 0 };
        made.kept = this.ops.keep(d).then(() => (made.ok = true), () => (made.ok = false));
        entry = made;
        this.entries.set(d, made);
      }
      if (entry.timer) clearTimeout(entry.timer);
      entry.timer = undefined;
      entry.users++;
      held.push(entry);
    }
    // The operation starts at once, beside the keeps: it takes hold of its regions when called (a
    // region set closed meanwhile must not take them away from it), and the driver's primary
    // context is reference-counted, so a keep that lands during the operation still outlives it.
    const run = use();
    run.catch(() => undefined); // settled below; not an unhandled rejection while the keeps finish
    try {
      await Promise.all(held.map((e) => e.kept));
      return await run;
    } finally {
      list.forEach((d, i) => this.done(d, held[i]!, idleMs));
    }
  }

  /** The devices whose contexts are kept now (in use or idle). */
  kept(): number[] {
    return [...this.entries.keys()].sort((a, b) => a - b);
  }

  /** Lets go of every idle context now. */
  async releaseIdle(): Promise<void> {
    await Promise.all([...this.entries].filter(([, e]) => e.users === 0).map(([d]) => this.drop(d)));
  }

  private done(device: number, entry: Entry, idleMs: number): void {
    entry.users--;
    if (entry.users > 0 || this.entries.get(device) !== entry) return;
    if (entry.ok === false) {
      this.entries.delete(device); // nothing kept: the next use tries again
      return;
    }
    entry.timer = setTimeout(() => void this.drop(device), idleMs);
    entry.timer.unref();
  }

  private async drop(device: number): Promise<void> {
    const entry = this.entries.get(device);
    if (!entry || entry.users > 0) return;
    this.entries.delete(device);
    if (entry.timer) clearTimeout(entry.timer);
    if (await entry.kept) await this.ops.release(device).catch(() => undefined);
  }
}

/**
 * One registry per process, shared by the ESM and CommonJS copies of vsnap (as the staging pools).
 */
const REGISTRY = Symbol.for('vsnap.deviceContexts.v1');

/** @internal */
export const deviceContexts: DeviceContexts = ((globalThis as Record<symbol, unknown>)[REGISTRY] as DeviceContexts | undefined) ??
  ((globalThis as Record<symbol, unknown>)[REGISTRY] = new DeviceContexts()) as DeviceContexts;
