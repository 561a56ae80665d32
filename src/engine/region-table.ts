import { VsnapError } from '../errors.js';
import { listDevices, type GpuDevice } from '../gpu/cuda.js';
import type { TensorInfo } from '../manifest/types.js';
import { ExportHeaderSchema } from './schemas.js';

/** One weights region of a rank: where it lives in the engine, and which GPU of this process that is. @internal */
export interface TableRegion {
  readonly rank: number;
  readonly key: string;
  readonly tag: string;
  readonly va: number;
  readonly size: number;
  readonly tensors: TensorInfo[];
  /** This process's ordinal of the engine's GPU (undefined for host memory). */
  readonly device: number | undefined;
  /** A describe's: whether the engine's own wake writes into the region (undefined: not said). */
  readonly wakeWrites?: boolean;
  /** An export's with digests: the region's GPU digests in chunks of the rank's `chunkSize`. */
  readonly digests?: readonly string[];
}

/** One rank's region table, its GPU found among this process's. @internal */
export interface TableRank<R extends TableRegion = TableRegion> {
  readonly rank: number;
  readonly pid: number;
  readonly deviceUuid: string;
  readonly memory: 'cuda' | 'host';
  readonly gpu?: GpuDevice;
  readonly regions: R[];
  /** An export's with digests: the chunk size of its regions' digests. */
  readonly chunkSize?: number;
}

/** Every rank's region table (rank order): what an export or a describe found. @internal */
export interface RegionTables<R extends TableRegion = TableRegion> {
  readonly ranks: ReadonlyArray<TableRank<R>>;
}

/**
 * The GPU of this process with `uuid`, where rank `rank` of the engine runs; refused clearly when
 * this process does not see it.
 * @internal
 */
export function rankGpu(gpus: readonly GpuDevice[], rank: number, uuid: string): GpuDevice {
  const gpu = gpus.find((g) => g.uuid === uuid);
  if (!gpu) throw new VsnapError('E_CUDA_UNAVAILABLE', `rank ${rank}'s GPU ${uuid} is not visible to this process: give it the same GPUs as the engine (CUDA_VISIBLE_DEVICES)`, { uuid });
  return gpu;
}

/**
 * The region tables the workers sent (an export's headers, or a describe's answer), checked:
 * each of the right shape, on a GPU this process sees, ranks 0..n-1 once each, sorted.
 * `pidOf` gives the sender's pid where the socket vouched for it.
 * @internal
 */
export async function readTables(headers: readonly unknown[], rankCount: number, pidOf: (i: number) => number | undefined = () => undefined): Promise<Array<TableRank>> {
  const parsed = headers.map((header, i) => {
    const p = ExportHeaderSchema.safeParse(header);
    if (!p.success) {
      const pid = pidOf(i);
      throw new VsnapError('E_ENGINE_PROTOCOL', `a worker${pid !== undefined ? ` (pid ${pid})` : ''} sent a region table of the wrong shape: ${p.error.issues[0]?.message}`, {
        issues: p.error.issues,
      });
    }
    return p.data;
  });
  const gpus = parsed.some((h) => h.memory === 'cuda') ? await listDevices() : [];
  const ranks = parsed.map((h): TableRank => {
    const gpu = h.memory === 'cuda' ? rankGpu(gpus, h.rank, h.device.uuid) : undefined;
    const device = gpu?.ordinal;
    const regions = h.regions.map(
      (r): TableRegion => ({
        rank: h.rank,
        key: r.key,
        tag: r.tag,
        va: r.va,
        size: r.size,
        tensors: r.tensors,
        device,
        ...(r.wakeWrites !== undefined ? { wakeWrites: r.wakeWrites } : {}),
        ...(r.digests !== undefined ? { digests: r.digests } : {}),
      }),
    );
    return { rank: h.rank, pid: h.pid, deviceUuid: h.device.uuid, memory: h.memory, ...(gpu ? { gpu } : {}), regions, ...(h.chunkSize !== undefined ? { chunkSize: h.chunkSize } : {}) };
  });
  ranks.sort((a, b) => a.rank - b.rank);
  if (ranks.length !== rankCount || ranks.some((r, i) => r.rank !== i)) {
    throw new VsnapError('E_ENGINE_PROTOCOL', `ranks sent are ${ranks.map((x) => x.rank).join(',')}, expected 0..${rankCount - 1}`);
  }
  return ranks;
}
