import type { RamLease } from '../cache/ram-tier.js';
import { decodeHeld, type HeldChunk } from '../cache/coded-tier.js';
import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { RegionInfo } from '../manifest/types.js';
import type { NativeTransferResult } from '../native/index.js';
import type { HostRegion } from '../regions/host-region.js';
import type { RegionMemory } from '../regions/memory.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import { decodeOnDevices, onDevice } from './device-decode.js';
import type { RestoreRegion } from './snapshot-types.js';

type Common = { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>;
interface Item {
  rank: number;
  region: RegionInfo;
  held: readonly HeldChunk[];
  memory: RegionMemory;
}

/**
 * A restore from a RAM-tier entry held coded (RamTierOptions.codec).
 *
 * Into GPU memory: every coded chunk's header and tables are checked on the host, then each chunk
 * crosses the link as it is held (coded, or raw where it did not shrink) into a device scratch
 * of two slots and is decoded from there into the target while the next crosses
 * (native/codec/codec_restore.h); the restore's GPU digest of the decoded bytes follows as for any
 * restore, before the engine is woken.
 *
 * Into host memory (the host backend): every chunk is decoded on the CPU first (a damaged one
 * refuses with E_CODEC_CORRUPT naming its region and chunk before any target is written), then the
 * decoded bytes go through the transfer engine's hydrate, every chunk checked against its checksum
 * before the first byte is written (`verifyFirst`).
 * @internal
 */
export async function restoreCoded(
  manifest: Manifest,
  lease: RamLease,
  targets: ReadonlyMap<string, RestoreRegion>,
  common: Common,
): Promise<{ bytes: number; devices?: NativeTransferResult['devices'] }> {
  const items: Item[] = [...manifest.regions()].map(({ rank, region }) => {
    const id = regionId(rank, region.key);
    return { rank, region, held: lease.chunks!.get(id)!, memory: targets.get(id)!.memory };
  });
  const multiRank = manifest.data.ranks.length > 1;
  const onHost = items.filter((x) => !onDevice(x.memory));
  const decoded: HostRegion[] = [];
  try {
    // host targets decoded before anything is written anywhere
    const hydrate = onHost.map((x) => {
      const out = decodeHeld(lease.buffer, x.region, x.held, manifest.name);
      decoded.push(out);
      return {
        name: multiRank ? `rank ${x.rank}/${x.region.key}` : x.region.key,
        blobPath: `/proc/self/fd/${out.fd}`,
        size: x.region.size,
        chunkSize: x.region.chunkSize,
        checksums: x.region.checksums,
        memory: x.memory,
      };
    });
    const gpu = await restoreOnDevices(manifest, lease, items.filter((x) => onDevice(x.memory)), common);
    const host = hydrate.length ? await runTransfer({ ...common, op: 'hydrate', verifyFirst: true, regions: hydrate }) : undefined;
    return { bytes: gpu.bytes + (host?.bytes ?? 0), devices: [...gpu.devices, ...(host?.devices ?? [])] };
  } finally {
    for (const d of decoded) d.close();
  }
}

async function restoreOnDevices(
  manifest: Manifest,
  lease: RamLease,
  items: readonly Item[],
  common: Common,
): Promise<{ bytes: number; devices: NonNullable<NativeTransferResult['devices']> }> {
  if (items.length === 0) return { bytes: 0, devices: [] };
  common.signal?.throwIfAborted();
  const result = await decodeOnDevices(
    lease.buffer,
    items.map((x) => ({ region: x.region, memory: x.memory, chunks: x.held.map((c, index) => ({ ...c, index })) })),
    manifest.name,
  );
  common.onProgress?.({ phase: 'done', bytesDone: result.rawBytes, bytesTotal: result.rawBytes });
  return { bytes: result.rawBytes, devices: result.devices };
}
