import { closeSync } from 'node:fs';

import { toVsnapError, VsnapError } from '../errors.js';
import { FdReceiver } from '../ipc/fd-receiver.js';
import type { RegionMemory } from '../regions/memory.js';
import type { EngineControl } from './control.js';
import { readTables, type RegionTables, type TableRegion } from './region-table.js';

/** One exported weights region: where it lives in the engine and how to reach it here. @internal */
export interface ExportedRegion extends TableRegion {
  readonly memory: RegionMemory;
}

/** Every rank's exported regions; close() closes the descriptors. @internal */
export interface ExportedRegions extends RegionTables<ExportedRegion> {
  readonly seconds: number;
  close(): void;
  /** Hands the descriptors over to the caller (close() then leaves them open). */
  takeFds(): void;
}

/** Descriptors of exports not closed yet, by the exporting worker's pid. */
const openByPid = new Map<number, number>();

function track(pids: readonly number[], fds: readonly number[], delta: 1 | -1): void {
  pids.forEach((pid, i) => {
    const n = (openByPid.get(pid) ?? 0) + delta * fds[i]!;
    if (n > 0) openByPid.set(pid, n);
    else openByPid.delete(pid);
  });
}

/**
 * How many descriptors exported by worker `pid` this process holds in exports not closed (or
 * handed over with takeFds) yet: a deep suspend refuses while there are any.
 * @internal
 */
export function openExports(pid: number): number {
  return openByPid.get(pid) ?? 0;
}

/**
 * Asks the engine's workers to send their weights regions and descriptors to a private socket,
 * one nonce per rank, and collects every rank's message. With `digestChunkSize` the workers add
 * their regions' GPU digests (each rank's `chunkSize` and each region's `digests`, where the
 * plugin gave them).
 * @internal
 */
export async function exportRegions(
  control: EngineControl,
  rankCount: number,
  options: { timeoutMs?: number; signal?: AbortSignal; digestChunkSize?: number } = {},
): Promise<ExportedRegions> {
  const started = performance.now();
  const receiver = await FdReceiver.listen();
  const received: number[] = [];
  try {
    const expected = Array.from({ length: rankCount }, () => receiver.expect({ timeoutMs: options.timeoutMs ?? 120_000, ...(options.signal ? { signal: options.signal } : {}) }));
    const messages = expected.map((e) =>
      e.message.then((m) => {
        received.push(...m.fds);
        return m;
      }),
    );
    // The export call returns once every worker has sent; wait for both, failing fast on either.
    const exportCall = control.exportTo(receiver.path, expected.map((e) => e.nonce), options.signal ? { signal: options.signal } : {}, options.digestChunkSize);
    const [, ...got] = await Promise.all([exportCall, ...messages]);
    const tables = await readTables(got.map((m) => m.header), rankCount, (i) => got[i]!.pid);
    const ranks = tables.map((t) => {
      const m = got.find((x) => (x.header as { rank?: unknown }).rank === t.rank)!;
      if (t.regions.length !== m.fds.length) {
        throw new VsnapError('E_ENGINE_PROTOCOL', `rank ${t.rank} sent ${m.fds.length} descriptors for ${t.regions.length} regions`);
      }
      const regions = t.regions.map((r, i): ExportedRegion => ({
        ...r,
        memory: t.memory === 'cuda' ? { kind: 'imported', fd: m.fds[i]!, device: r.device! } : { kind: 'host', fd: m.fds[i]! },
      }));
      return { ...t, regions };
    });
    let closed = false;
    const pids = got.map((m) => m.pid);
    const counts = got.map((m) => m.fds.length);
    track(pids, counts, 1);
    return {
      ranks,
      seconds: (performance.now() - started) / 1000,
      close() {
        if (closed) return;
        closed = true;
        track(pids, counts, -1);
        for (const fd of received) closeSync(fd);
      },
      takeFds() {
        // The taker (tier 0) owns them now; deep suspend and tier 0 are exclusive per engine.
        if (!closed) track(pids, counts, -1);
        closed = true;
      },
    };
  } catch (err) {
    for (const fd of received) closeSync(fd);
    throw toVsnapError(err);
  } finally {
    receiver.close();
  }
}
