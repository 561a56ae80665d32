import { availableParallelism } from 'node:os';

import { toVsnapError } from '../errors.js';
import { native, type NativeStagingPool } from '../native/index.js';
import { stagingIdleMs } from '../settings.js';
import { deviceContexts } from './contexts.js';

/** Default chunk and slot size: large copies reach the PCIe line rate (54.2 GB/s at 64 MiB on an H200). */
export const DEFAULT_CHUNK_SIZE = 64 * 1024 * 1024;

/** Worker threads of a transfer: one per core, at most 16 per GPU it moves bytes to or from. */
export function defaultThreads(devices = 1): number {
  return Math.max(1, Math.min(16 * Math.max(1, devices), availableParallelism()));
}

interface PoolEntry {
  pool: Promise<NativeStagingPool>;
  ready?: NativeStagingPool;
  users: number;
  timer?: NodeJS.Timeout;
}

/**
 * Staging pools shared by every transfer of this process: one per (slot size, pinned), pinned
 * portable (one pool serves every GPU at the line rate), created on first use (pinning happens
 * once, not per transfer), freed after an idle period.
 * @internal
 */
class StagingPools {
  private readonly entries = new Map<string, PoolEntry>();

  /**
   * Lends the pool of `slotSize` slots, made on first use with two slots for each of `threads`
   * workers (at least the default count for one GPU). A later job that wants more workers runs as many as the pool has slots for: a
   * pool is never made again for a different thread count, so pinning stays off the swap path.
   */
  async lease<T>(slotSize: number, pinDevice: number, threads: number, use: (pool: NativeStagingPool) => Promise<T>): Promise<T> {
    // pools not used for this long are freed (and unpinned), so an idle SDK holds no pinned memory
    const idleMs = stagingIdleMs();
    const key = `${slotSize}:${pinDevice >= 0 ? 'pinned' : 'host'}`;
    let entry = this.entries.get(key);
    if (!entry) {
      const slots = 2 * Math.max(threads, defaultThreads());
      const created = native().createStagingPool(slotSize, slots, pinDevice);
      const made: PoolEntry = { pool: created, users: 0 };
      entry = made;
      this.entries.set(key, entry);
      created.then((p) => (made.ready = p), () => undefined);
      created.catch(() => this.entries.delete(key));
    }
    if (entry.timer) clearTimeout(entry.timer);
    entry.timer = undefined;
    entry.users++;
    try {
      let pool: NativeStagingPool;
      try {
        pool = await entry.pool;
      } catch (err) {
        throw toVsnapError(err);
      }
      return await use(pool);
    } finally {
      entry.users--;
      if (entry.users === 0) {
        entry.timer = setTimeout(() => this.drop(key), idleMs);
        entry.timer.unref();
      }
    }
  }

  /** Pinned host memory the pools hold now, in bytes (for leak checks). */
  pinnedBytes(): number {
    let n = 0;
    for (const e of this.entries.values()) if (e.ready?.pinned && !e.ready.closed) n += e.ready.slotSize * e.ready.slotCount;
    return n;
  }

  /** How many pools exist now (in use or idle). */
  get size(): number {
    return this.entries.size;
  }

  /** Frees every idle pool now. */
  async releaseIdle(): Promise<void> {
    for (const [key, entry] of this.entries) if (entry.users === 0) this.drop(key);
  }

  private drop(key: string): void {
    const entry = this.entries.get(key);
    if (!entry || entry.users > 0) return;
    this.entries.delete(key);
    if (entry.timer) clearTimeout(entry.timer);
    entry.pool.then((p) => p.close(), () => undefined);
  }
}

/**
 * One registry per process: the ESM and the CommonJS build of vsnap are two copies of this module,
 * and both must lend from the same pools (pinned memory is made once per process, not per build).
 * The key carries a layout version, so a copy with an incompatible registry makes its own.
 */
const REGISTRY = Symbol.for('vsnap.stagingPools.v1');

/** @internal */
export const stagingPools: StagingPools = ((globalThis as Record<symbol, unknown>)[REGISTRY] as StagingPools | undefined) ??
  ((globalThis as Record<symbol, unknown>)[REGISTRY] = new StagingPools()) as StagingPools;
