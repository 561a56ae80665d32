import { closeSync } from 'node:fs';

import { toVsnapError, VsnapError } from '../errors.js';
import { listDevices, type GpuDevice } from '../gpu/cuda.js';
import { FdReceiver } from '../ipc/fd-receiver.js';
import type { TensorInfo } from '../manifest/types.js';
import type { RegionMemory } from '../regions/memory.js';
import type { EngineControl } from './control.js';
import { ExportHeaderSchema } from './schemas.js';

/** One exported weights region: where it lives in the engine and how to reach it here. @internal */
export interface ExportedRegion {
  readonly rank: number;
  readonly key: string;
  readonly tag: string;
  readonly va: number;
  readonly size: number;
  readonly tensors: TensorInfo[];
  readonly memory: RegionMemory;
  /** This process's ordinal of the engine's GPU (undefined for host memory). */
  readonly device: number | undefined;
}

/** Every rank's exported regions; close() closes the descriptors. @internal */
export interface ExportedRegions {
  readonly ranks: ReadonlyArray<{ rank: number; pid: number; deviceUuid: string; memory: 'cuda' | 'host'; gpu?: GpuDevice; regions: ExportedRegion[] }>;
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
 * one nonce per rank, and collects every rank's message.
 * @internal
 */
export async function exportRegions(control: EngineControl, rankCount: number, options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<ExportedRegions> {
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
    const exportCall = control.exportTo(receiver.path, expected.map((e) => e.nonce), options.signal ? { signal: options.signal } : {});
    const [, ...got] = await Promise.all([exportCall, ...messages]);
    const gpus = got.some((m) => (m.header as { memory?: string }).memory === 'cuda') ? await listDevices() : [];
    const ranks = got.map((m) => {
      const parsed = ExportHeaderSchema.safeParse(m.header);
      if (!parsed.success) {
        throw new VsnapError('E_ENGINE_PROTOCOL', `a worker (pid ${m.pid}) sent a region table of the wrong shape: ${parsed.error.issues[0]?.message}`, {
          issues: parsed.error.issues,
        });
      }
      const h = parsed.data;
      if (h.regions.length !== m.fds.length) {
        throw new VsnapError('E_ENGINE_PROTOCOL', `rank ${h.rank} sent ${m.fds.length} descriptors for ${h.regions.length} regions`);
      }
      const gpu = h.memory === 'cuda' ? gpus.find((g) => g.uuid === h.device.uuid) : undefined;
      const device = gpu?.ordinal;
      if (h.memory === 'cuda') {
        if (device === undefined) {
          throw new VsnapError('E_CUDA_UNAVAILABLE', `rank ${h.rank}'s GPU ${h.device.uuid} is not visible to this process: give it the same GPUs as the engine (CUDA_VISIBLE_DEVICES)`, {
            uuid: h.device.uuid,
          });
        }
      }
      const regions = h.regions.map((r, i): ExportedRegion => ({
        rank: h.rank,
        key: r.key,
        tag: r.tag,
        va: r.va,
        size: r.size,
        tensors: r.tensors,
        memory: h.memory === 'cuda' ? { kind: 'imported', fd: m.fds[i]!, device: device! } : { kind: 'host', fd: m.fds[i]! },
        device,
      }));
      return { rank: h.rank, pid: h.pid, deviceUuid: h.device.uuid, memory: h.memory, ...(gpu ? { gpu } : {}), regions };
    });
    ranks.sort((a, b) => a.rank - b.rank);
    ranks.forEach((r, i) => {
      if (r.rank !== i) throw new VsnapError('E_ENGINE_PROTOCOL', `ranks sent are ${ranks.map((x) => x.rank).join(',')}, expected 0..${rankCount - 1}`);
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
