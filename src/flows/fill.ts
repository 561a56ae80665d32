import { closeSync } from 'node:fs';

import { toVsnapError, VsnapError } from '../errors.js';
import type { HandOverRank } from '../engine/hand-over.js';
import type { RegionTables } from '../engine/region-table.js';
import type { LiveRegionRef } from '../digest/compare.js';
import { DeviceAllocation } from '../gpu/device-allocation.js';
import { regionId } from '../manifest/region-id.js';
import { HostRegion } from '../regions/host-region.js';
import { MappedRegions } from '../regions/mapped.js';
import type { RestoreRegion } from '../snapshot/snapshot-types.js';

/*
 * A restore's new weights memory, made here rather than by the engine's wake: one exportable
 * allocation per region of the sleeping engine's table (GPU memory on the rank's GPU; a memfd for
 * the CPU engine), which the hydrate fills while the engine's wake maps the same memory at its
 * addresses (the plugin's adopt, as tier 0 hands held weights back). The wake, the export and the
 * copy then run at once instead of one after another. Once the engine has mapped it, the engine's
 * handle keeps the memory: close() lets go of this process's handles, mappings and descriptors,
 * and the engine's next sleep frees it.
 */

/** The memory made for one restore. @internal */
export interface FillMemory {
  /** The regions as Snapshot.restore takes them, rank by rank in table order. */
  readonly regions: RestoreRegion[];
  /** The same regions as live regions (for a GPU digest, or a peer copy). */
  readonly live: LiveRegionRef[];
  /** What the engine's wake adopts, one entry per rank. */
  readonly ranks: HandOverRank[];
  /** The regions (by region id) the engine's wake writes into itself: filled only after it (unsaid counts as written). */
  readonly wakeWrites: ReadonlySet<string>;
  /** Bytes made. */
  readonly bytes: number;
  /** Lets go of this process's hold on the memory: its mappings here, handles and descriptors (idempotent). */
  close(): Promise<void>;
}

type Made = { kind: 'device'; allocation: DeviceAllocation; fd: number } | { kind: 'host'; region: HostRegion };

/**
 * Makes exportable memory for every region of `tables`, each exactly its region's size (an engine's
 * regions are multiples of the VMM granularity: one that is not is refused, since the engine could
 * not map a larger allocation in its place). On any failure (no room on the GPU), what was made is
 * let go before the error is thrown.
 * @internal
 */
export async function makeFillMemory(tables: RegionTables): Promise<FillMemory> {
  const wanted = tables.ranks.flatMap((r) => r.regions.map((x) => ({ rank: r, region: x })));
  const settled = await Promise.allSettled(
    wanted.map(async ({ rank, region }): Promise<Made> => {
      if (rank.memory === 'host') return { kind: 'host', region: HostRegion.create(region.size, 'vsnap-fill') };
      const allocation = await DeviceAllocation.allocate(region.device!, region.size);
      try {
        if (allocation.size !== region.size) {
          throw new VsnapError(
            'E_ENGINE_PROTOCOL',
            `rank ${rank.rank}'s region ${JSON.stringify(region.key)} is ${region.size} bytes, not a multiple of the GPU's VMM granularity (${allocation.size} allocated): ` +
              'the engine cannot map new memory in its place. Restore with VSNAP_RESTORE_TARGETS=wake, and report the engine version.',
            { rank: rank.rank, key: region.key, size: region.size, allocated: allocation.size },
          );
        }
        return { kind: 'device', allocation, fd: allocation.exportFd() };
      } catch (err) {
        allocation.close();
        throw err;
      }
    }),
  );
  const made = settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  let mapped: MappedRegions | undefined;
  let closing: Promise<void> | undefined;
  const release = (): void => {
    for (const m of made) {
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
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) {
    release();
    const e = toVsnapError(failed.reason);
    throw new VsnapError(e.code, `new memory for the engine's weights could not be made (${made.length} of ${wanted.length} regions were): ${e.message}`, e.details, { cause: e });
  }
  // Host memory (memfds) mapped here once, for the copy and the digest that verifies it; GPU memory made here is mapped already.
  try {
    mapped = await MappedRegions.open(made.map((m, i) => ({ memory: m.kind === 'host' ? m.region.memory : ({ kind: 'device', allocation: m.allocation } as const), size: wanted[i]!.region.size })));
  } catch (err) {
    release();
    throw toVsnapError(err);
  }
  const regions: RestoreRegion[] = [];
  const live: LiveRegionRef[] = [];
  const ranks: HandOverRank[] = tables.ranks.map(() => ({ regions: [], fds: [] }));
  const wakeWrites = new Set<string>();
  wanted.forEach(({ rank, region }, i) => {
    const m = made[i]!;
    const memory = mapped!.memory(i);
    regions.push({ key: region.key, size: region.size, tag: region.tag, rank: rank.rank, memory });
    if (region.wakeWrites !== false) wakeWrites.add(regionId(rank.rank, region.key));
    live.push({ rank: rank.rank, key: region.key, size: region.size, memory });
    const r = ranks[tables.ranks.indexOf(rank)] as { regions: HandOverRank['regions'][number][]; fds: number[] };
    r.regions.push({ key: region.key, va: region.va, size: region.size });
    r.fds.push(m.kind === 'host' ? m.region.fd : m.fd);
  });
  return { regions, live, ranks, wakeWrites, bytes: wanted.reduce((n, w) => n + w.region.size, 0), close };
}
