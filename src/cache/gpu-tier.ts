import { closeSync } from 'node:fs';

import type { ExportedRegions } from '../engine/export.js';
import { handOver } from '../engine/hand-over.js';
import { toVsnapError, VsnapError } from '../errors.js';
import { native, type NativeHeldHandles } from '../native/index.js';
import { checkLive, type LiveCheckReport } from '../digest/compare.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionMemory } from '../regions/memory.js';

/** One suspended engine's weights kept on the GPU. @internal */
export interface GpuHold {
  readonly key: string;
  readonly snapshotId: string;
  readonly bytes: number;
  readonly since: number;
  readonly ranks: ReadonlyArray<{ rank: number; pid: number; regions: Array<{ key: string; va: number; size: number }>; fds: number[] }>;
}

/**
 * What tier 0 holds for one engine.
 * @public
 */
export interface GpuEntry {
  /** The engine (its base URL). */
  readonly engine: string;
  /** The snapshot its weights match. */
  readonly snapshotId: string;
  /** GPU memory kept. */
  readonly bytes: number;
  /** When it was suspended (ms since the epoch). */
  readonly since: number;
}

/**
 * Tier 0: the weights of suspended engines kept on the GPU. A suspend with it keeps a reference
 * (imported handle and descriptor) to every weights region, so vLLM's sleep frees only the KV
 * cache; the next wake maps the very same memory back at the same addresses: no bytes move. The
 * memory counts against the GPU until {@link GpuTier.release} (demotion; the snapshot in
 * the store, taken before, still brings the weights back) or until the engine is restored from
 * it. If this process dies, the driver frees the memory and the engine restores from the store.
 * @public
 */
export class GpuTier {
  private readonly held = new Map<string, GpuHold & { handles: NativeHeldHandles | undefined }>();
  private closed = false;

  /** GPU memory kept, in total. */
  get bytes(): number {
    let n = 0;
    for (const e of this.held.values()) n += e.bytes;
    return n;
  }

  /** Every engine held, oldest first. */
  entries(): GpuEntry[] {
    return [...this.held.values()].sort((a, b) => a.since - b.since).map((e) => ({ engine: e.key, snapshotId: e.snapshotId, bytes: e.bytes, since: e.since }));
  }

  /** Whether an engine's weights are held. */
  has(engine: string): boolean {
    return this.held.has(engine);
  }

  /** Keeps an engine's exported weights alive (takes over the descriptors). @internal */
  async hold(engine: string, snapshotId: string, exported: ExportedRegions): Promise<void> {
    if (this.closed) throw new VsnapError('E_CLOSED', 'this GpuTier was closed');
    this.release(engine);
    const fds = exported.ranks.flatMap((r) => r.regions.map((x) => (x.memory as { fd: number }).fd));
    let handles: NativeHeldHandles | undefined;
    if (exported.ranks.some((r) => r.memory === 'cuda')) {
      try {
        handles = await native().holdHandles(fds);
      } catch (err) {
        throw toVsnapError(err);
      }
    }
    exported.takeFds();
    this.held.set(engine, {
      key: engine,
      snapshotId,
      since: Date.now(),
      bytes: exported.ranks.reduce((n, r) => n + r.regions.reduce((m, x) => m + x.size, 0), 0),
      ranks: exported.ranks.map((r) => ({
        rank: r.rank,
        pid: r.pid,
        regions: r.regions.map((x) => ({ key: x.key, va: x.va, size: x.size })),
        fds: r.regions.map((x) => (x.memory as { fd: number }).fd),
      })),
      handles,
    });
  }

  /** The held weights of an engine. @internal */
  peek(engine: string): GpuHold | undefined {
    return this.held.get(engine);
  }

  /**
   * Hands an engine its held weights back: offers each rank its descriptors and runs `wake`, which
   * makes the engine fetch them and map them back (engine/hand-over.ts owns that lifecycle). The
   * holding stays until {@link GpuTier.release}. Throws what `wake` threw, or why an offer
   * was not taken.
   * @internal
   */
  async adopt(
    engine: string,
    wake: (adopt: { socket: string; nonces: readonly string[] }) => Promise<void>,
    options: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<{ bytes: number }> {
    const held = this.held.get(engine);
    if (!held) throw new VsnapError('E_INVALID_ARGUMENT', `tier 0 holds no weights of ${engine}`, { engine });
    await handOver(held.ranks, wake, options);
    return { bytes: held.bytes };
  }

  /** Lets go of an engine's weights (its GPU memory is freed once nothing else maps it). */
  release(engine: string): boolean {
    const e = this.held.get(engine);
    if (!e) return false;
    this.held.delete(engine);
    e.handles?.close();
    for (const r of e.ranks) for (const fd of r.fds) closeSync(fd);
    return true;
  }

  /** Releases everything. */
  close(): void {
    this.closed = true;
    for (const key of [...this.held.keys()]) this.release(key);
  }

  /** Same as {@link GpuTier.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/**
 * Tier 0: the dirty check on weights held for a suspended engine, before they are released
 * (a demotion). The held descriptors are digested where they live (on the GPU for CUDA memory).
 * @internal
 */
export async function checkGpuHold(manifest: Manifest, entry: GpuHold): Promise<LiveCheckReport> {
  const kind = manifest.data.platform.kind === 'cuda' ? 'imported' : 'host';
  const live = entry.ranks.flatMap((r) => r.regions.map((x, i) => ({ rank: r.rank, key: x.key, size: x.size, memory: { kind, fd: r.fds[i]! } as RegionMemory })));
  return checkLive(manifest, live);
}

