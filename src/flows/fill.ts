import { closeSync } from 'node:fs';

import { toVsnapError, VsnapError } from '../errors.js';
import type { EngineStatus } from '../engine/engine-client.js';
import type { HandOverRank } from '../engine/hand-over.js';
import { rankGpu, type RegionTables } from '../engine/region-table.js';
import { DeviceAllocation } from '../gpu/device-allocation.js';
import { listDevices } from '../gpu/cuda.js';
import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import { HostRegion } from '../regions/host-region.js';
import { MappedRegions } from '../regions/mapped.js';
import type { EarlyRestore } from '../snapshot/early-restore.js';
import type { RestoreRegion } from '../snapshot/snapshot-types.js';

/*
 * A restore's new weights memory, made here rather than by the engine's wake: one exportable
 * allocation per region of the snapshot (GPU memory on the rank's GPU; a memfd for the CPU engine),
 * which the hydrate fills while the engine's wake maps the same memory at its addresses (the
 * plugin's adopt, as tier 0 hands held weights back). The wake, the export and the copy then run at
 * once instead of one after another. The memory is made from the snapshot's sizes in two parts:
 * the largest regions first, whose copy starts at once, then the rest while they are copied and the
 * engine's region table is read (a snapshot that does not match it is refused, and the memory let
 * go, before the engine is touched). Once the engine has mapped it, the engine's handle keeps the memory: close() lets
 * go of this process's handles, mappings and descriptors, and the engine's next sleep frees it.
 */

/**
 * One region to make: the snapshot's rank, key, tag, size and how many of the model's tensors it
 * holds (0: none, or not described), on the rank's GPU (undefined: host memory).
 * @internal
 */
export interface FillRegion {
  readonly rank: number;
  readonly key: string;
  readonly tag: string;
  readonly size: number;
  readonly tensors: number;
  readonly device: number | undefined;
}

/** The memory made for some regions of one restore. @internal */
export interface FillMemory {
  /** The regions as Snapshot.restore takes them, in the order asked for. */
  readonly regions: RestoreRegion[];
  /** Bytes made. */
  readonly bytes: number;
  /** The descriptor of a region's memory (by region id), for the engine to import; undefined: not made here. */
  descriptor(id: string): number | undefined;
  /** Lets go of this process's hold on the memory: its mappings here, handles and descriptors (idempotent). */
  close(): Promise<void>;
}

/**
 * What the engine's wake adopts, one entry per rank of `tables` (the engine's region table, checked
 * against the snapshot: same keys and sizes), with each region's address there and the descriptor
 * of the memory made for it in one of `parts`; and the regions (by region id) the engine's wake
 * writes into itself, to be filled only after it (unsaid counts as written).
 * @internal
 */
export function fillHandOver(tables: RegionTables, parts: readonly FillMemory[]): { ranks: HandOverRank[]; wakeWrites: ReadonlySet<string> } {
  const wakeWrites = new Set<string>();
  const ranks = tables.ranks.map((rank): HandOverRank => {
    const fds: number[] = [];
    const list = rank.regions.map((region) => {
      const id = regionId(rank.rank, region.key);
      const fd = parts.map((p) => p.descriptor(id)).find((x) => x !== undefined);
      if (fd === undefined) throw new VsnapError('E_INTERNAL', `no memory was made for rank ${rank.rank}'s region ${JSON.stringify(region.key)} (the table was checked against the snapshot)`);
      if (region.wakeWrites !== false) wakeWrites.add(id);
      fds.push(fd);
      return { key: region.key, va: region.va, size: region.size };
    });
    return { regions: list, fds };
  });
  return { ranks, wakeWrites };
}

/**
 * The share of the bytes whose memory is made before the copy starts: the largest regions, so
 * few allocations stand before the first byte moves; the rest is made while they are copied
 * (copying 12% of the bytes takes longer than making the other regions' memory: on an H200, 39
 * against about 30 ms for 16.74 GiB in 252 regions).
 */
const FIRST_SHARE = 0.12;

/**
 * At most this many regions in the first part, and in each part of the rest: with thousands of
 * small regions, making an allocation costs about as long as copying it (about 0.1 ms for 4 MiB on
 * an H200), so the copy starts on a few and follows the rest part by part as it is made, instead
 * of waiting for 12% of the bytes in 480 allocations and then for the other 3,520.
 */
const PART_REGIONS = 64;

/** At most this many bytes in a part of the rest: the copy follows it part by part. */
const PART_BYTES = 2 * 1024 ** 3;

/** Parts of the rest made at once (each one native call on a thread of the libuv pool). */
const PART_CONCURRENCY = 2;

/**
 * The regions (by region id) to make and copy first: the largest of those holding a tensor of the
 * model, until they hold FIRST_SHARE of the bytes or number PART_REGIONS (at least one region; none
 * of an empty list).
 * A region with no tensor of the model is one the engine's wake may write into (vLLM's plugin
 * says so of every such region: `wakeWrites`), so it is copied only after the wake, and copied
 * twice if it was among the first: on an H200 the reference engine on vLLM's allocator has 36
 * such regions (3.5 GiB of 16.74, segments its caching allocator kept), 13 of them (1.37 GiB)
 * among the largest. Only when no region holds a described tensor are the largest of all taken.
 * @internal
 */
export function firstRegions(wanted: readonly FillRegion[]): ReadonlySet<string> {
  const total = wanted.reduce((n, w) => n + w.size, 0);
  const first = new Set<string>();
  let sum = 0;
  const described = wanted.filter((w) => w.tensors > 0);
  for (const w of [...(described.length > 0 ? described : wanted)].sort((a, b) => b.size - a.size)) {
    if (first.size > 0 && (sum >= total * FIRST_SHARE || first.size >= PART_REGIONS)) break;
    first.add(regionId(w.rank, w.key));
    sum += w.size;
  }
  return first;
}

/**
 * The regions to make for `manifest`'s snapshot in the engine of `status` (its ranks' GPUs found
 * among this process's by UUID).
 * @internal
 */
export async function fillRegions(manifest: Manifest, status: EngineStatus): Promise<FillRegion[]> {
  const gpus = status.ranks.some((r) => r.memory === 'cuda') ? await listDevices() : [];
  const device = (rank: number): number | undefined => {
    const r = status.ranks.find((x) => x.rank === rank);
    return !r || r.memory === 'host' ? undefined : rankGpu(gpus, rank, r.device.uuid).ordinal;
  };
  return [...manifest.regions()].map(({ rank, region }) => ({ rank, key: region.key, tag: region.tag, size: region.size, tensors: region.tensors.length, device: device(rank) }));
}

/**
 * The first part of a restore's memory, made from the snapshot alone while the engine's status is
 * still being read (the GPU of each rank as the manifest names it): what {@link startFill} takes
 * when the engine turns out to match (same first regions, each on the same GPU), else lets go.
 * @internal
 */
export interface EarlyFill {
  /** The first regions (by region id) made, as {@link firstRegions} chose them. */
  readonly ids: ReadonlySet<string>;
  /** Those regions, as they were made. */
  readonly made: readonly FillRegion[];
  readonly memory: FillMemory;
  /** The copy into `memory` from the RAM tier, started as soon as it was made (where the RAM tier holds the snapshot). */
  readonly copy: EarlyRestore | undefined;
  /** Lets go of it where no restore took it: the copy stopped (nothing left in flight), then the memory. Idempotent. */
  close(): Promise<void>;
}

/** Starts the copy into the first part's memory (Snapshot.startRestore), or undefined where it cannot. @internal */
export type StartEarlyCopy = (regions: readonly RestoreRegion[]) => Promise<EarlyRestore | undefined>;

/**
 * Makes the first part of `manifest`'s memory on the GPUs its ranks were captured on (host
 * memory for a host rank), before the engine is read, and with `startCopy` starts copying into it
 * at once. Undefined, with nothing left allocated, when a GPU is not visible here or the memory
 * cannot be made: the restore then makes it after the status, as without this. A copy that
 * cannot start is left to the restore.
 * @internal
 */
export async function makeEarlyFill(manifest: Manifest, startCopy?: StartEarlyCopy): Promise<EarlyFill | undefined> {
  try {
    const ranks = manifest.data.ranks;
    const gpus = ranks.some((r) => r.device !== null) ? await listDevices() : [];
    const ordinal = new Map<number, number | undefined>();
    for (const r of ranks) {
      if (r.device === null) ordinal.set(r.rank, undefined);
      else {
        const gpu = gpus.find((g) => g.uuid === r.device!.uuid);
        if (!gpu) return undefined;
        ordinal.set(r.rank, gpu.ordinal);
      }
    }
    const wanted = [...manifest.regions()].map(({ rank, region }): FillRegion => ({ rank, key: region.key, tag: region.tag, size: region.size, tensors: region.tensors.length, device: ordinal.get(rank) }));
    const ids = firstRegions(wanted);
    const made = wanted.filter((w) => ids.has(regionId(w.rank, w.key)));
    const memory = await makeFillMemory(made);
    const copy = startCopy ? await startCopy(memory.regions).catch(() => undefined) : undefined;
    let closing: Promise<void> | undefined;
    const close = (): Promise<void> =>
      (closing ??= (async () => {
        try {
          await copy?.abandon();
        } finally {
          await memory.close();
        }
      })());
    return { ids, made, memory, copy, close };
  } catch {
    return undefined; // made again after the status, where a real failure is reported
  }
}

/** Whether `early` is the first part a restore of `wanted` (the engine as read) would make: the same regions, sizes and GPUs. @internal */
export function earlyFits(early: EarlyFill, wanted: readonly FillRegion[], firstIds: ReadonlySet<string>): boolean {
  if (early.ids.size !== firstIds.size || [...firstIds].some((id) => !early.ids.has(id))) return false;
  const live = new Map(wanted.map((w) => [regionId(w.rank, w.key), w]));
  return early.made.every((m) => {
    const w = live.get(regionId(m.rank, m.key));
    return w !== undefined && w.size === m.size && w.device === m.device;
  });
}

type Made = { kind: 'device'; allocation: DeviceAllocation; fd: number } | { kind: 'host'; region: HostRegion };

/**
 * Makes exportable memory for every region of `wanted`, each exactly its region's size (an engine's
 * regions are multiples of the VMM granularity: one that is not is refused, since the engine could
 * not map a larger allocation in its place). GPU memory is made in one set per GPU (one address
 * reservation and one access call for all its regions: {@link DeviceAllocation.allocateSet}), one
 * native call on one thread of the libuv pool; host memory region by region. On any failure (no
 * room on the GPU), what was made is let go before the error is thrown.
 * @internal
 */
export async function makeFillMemory(wanted: readonly FillRegion[]): Promise<FillMemory> {
  const made: Made[] = [];
  let failure: { reason: unknown } | undefined;
  const byDevice = new Map<number, number[]>();
  wanted.forEach((region, i) => {
    if (region.device === undefined) return;
    const list = byDevice.get(region.device) ?? [];
    list.push(i);
    byDevice.set(region.device, list);
  });
  const makeSet = async (device: number, indexes: readonly number[]): Promise<void> => {
    let allocations: DeviceAllocation[];
    try {
      allocations = await DeviceAllocation.allocateSet(device, indexes.map((i) => wanted[i]!.size));
    } catch (reason) {
      failure ??= { reason };
      return;
    }
    indexes.forEach((i, k) => {
      const region = wanted[i]!;
      const allocation = allocations[k]!;
      if (failure) return allocation.close();
      try {
        if (allocation.size !== region.size) {
          throw new VsnapError(
            'E_ENGINE_PROTOCOL',
            `rank ${region.rank}'s region ${JSON.stringify(region.key)} is ${region.size} bytes, not a multiple of the GPU's VMM granularity (${allocation.size} allocated): ` +
              'the engine cannot map new memory in its place (its regions are whole VMM allocations in vLLM). Report the engine and plugin versions.',
            { rank: region.rank, key: region.key, size: region.size, allocated: allocation.size },
          );
        }
        made[i] = { kind: 'device', allocation, fd: allocation.exportFd() };
      } catch (reason) {
        allocation.close();
        failure ??= { reason };
      }
    });
  };
  try {
    wanted.forEach((region, i) => {
      if (region.device === undefined) made[i] = { kind: 'host', region: HostRegion.create(region.size, 'vsnap-fill') };
    });
  } catch (reason) {
    failure ??= { reason };
  }
  if (!failure) await Promise.all([...byDevice].map(([device, indexes]) => makeSet(device, indexes)));
  let mapped: MappedRegions | undefined;
  let closing: Promise<void> | undefined;
  const release = (): void => {
    for (const m of made) {
      if (!m) continue; // a hole left by a failure
      if (m.kind === 'host') m.region.close();
      else {
        closeSync(m.fd);
        m.allocation.close();
      }
    }
  };
  const close = (): Promise<void> =>
    (closing ??= (async () => {
      try {
        await mapped?.close();
      } finally {
        release();
      }
    })());
  if (failure) {
    release();
    const e = toVsnapError(failure.reason);
    const count = made.filter(Boolean).length;
    throw new VsnapError(e.code, `new memory for the engine's weights could not be made (${count} of ${wanted.length} regions were): ${e.message}`, e.details, { cause: e });
  }
  // Host memory (memfds) mapped here once, for the copy and the digest that verifies it; GPU memory made here is mapped already.
  try {
    mapped = await MappedRegions.open(made.map((m, i) => ({ memory: m.kind === 'host' ? m.region.memory : ({ kind: 'device', allocation: m.allocation } as const), size: wanted[i]!.size })));
  } catch (err) {
    release();
    throw toVsnapError(err);
  }
  const regions = wanted.map((region, i): RestoreRegion => ({ key: region.key, size: region.size, tag: region.tag, rank: region.rank, memory: mapped!.memory(i) }));
  const fds = new Map(wanted.map((region, i) => {
    const m = made[i]!;
    return [regionId(region.rank, region.key), m.kind === 'host' ? m.region.fd : m.fd] as const;
  }));
  return { regions, bytes: wanted.reduce((n, w) => n + w.size, 0), descriptor: (id) => fds.get(id), close };
}

/**
 * The rest's memory (fill.ts) in parts of at most PART_REGIONS regions and PART_BYTES, those holding
 * a tensor of the model first (the copy takes them as they come; the others wait for the engine's
 * region table), PART_CONCURRENCY at once. `made` is told each part as soon as it is made (the
 * restore lets go of it from then on). On a failure, every part in flight is waited for (and told,
 * where it was made) before the first error is thrown: nothing is left unaccounted for.
 * @internal
 */
export async function makeFillMemoryInParts(wanted: readonly FillRegion[], made: (part: FillMemory) => void): Promise<FillMemory[]> {
  const parts: FillRegion[][] = [];
  let part: FillRegion[] = [];
  let bytes = 0;
  for (const w of [...wanted.filter((x) => x.tensors > 0), ...wanted.filter((x) => x.tensors === 0)]) {
    if (part.length > 0 && (part.length >= PART_REGIONS || bytes + w.size > PART_BYTES)) {
      parts.push(part);
      part = [];
      bytes = 0;
    }
    part.push(w);
    bytes += w.size;
  }
  if (part.length > 0) parts.push(part);
  const out: FillMemory[] = [];
  let failure: { reason: unknown } | undefined;
  let next = 0;
  const worker = async (): Promise<void> => {
    while (!failure && next < parts.length) {
      const mine = parts[next++]!;
      try {
        const memory = await makeFillMemory(mine);
        out.push(memory);
        made(memory);
      } catch (reason) {
        failure ??= { reason };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(PART_CONCURRENCY, parts.length) }, worker));
  if (failure) throw failure.reason;
  return out;
}
