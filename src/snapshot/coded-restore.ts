import type { RamLease } from '../cache/ram-tier.js';
import { decodeHeld, type HeldChunk } from '../cache/coded-tier.js';
import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { RegionInfo } from '../manifest/types.js';
import { native, type NativeTransferResult } from '../native/index.js';
import type { HostRegion } from '../regions/host-region.js';
import type { RegionMemory } from '../regions/memory.js';
import { runTransfer, type TransferOptions, type TransferRegion } from '../transfer/transfer.js';
import { decodeOnDevices, onDevice, restoreScratchShortage, warnDecodedOnCpu } from './device-decode.js';
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
 * restore, before the engine is woken. Where the GPUs have no room for the scratch (a woken
 * engine's card is full), nothing has been issued: those regions are decoded on the CPU instead,
 * as host targets are (a `VSNAP_CODEC` warning says so; `decodedOnDevice` false).
 *
 * Into host memory (the host backend), and GPU memory without room for the scratch: every chunk is
 * decoded on the CPU first (a damaged one refuses with E_CODEC_CORRUPT naming its region and chunk
 * before any target is written), then the decoded bytes go through the transfer engine's hydrate,
 * every chunk checked against its checksum before the first byte is written (`verifyFirst`). A
 * capture whose hash was deferred has no checksums yet: the decoded bytes' own are given to the
 * hydrate, and the check is the restore's GPU digest, which runs for such a capture whatever
 * `verifyDigests` says. Host memory: the decoded regions, all held until the copy ends.
 * @internal
 */
export async function restoreCoded(
  manifest: Manifest,
  lease: RamLease,
  targets: ReadonlyMap<string, RestoreRegion>,
  common: Common,
): Promise<{ bytes: number; devices?: NativeTransferResult['devices']; decodedOnDevice: boolean }> {
  const items: Item[] = [...manifest.regions()].map(({ rank, region }) => {
    const id = regionId(rank, region.key);
    return { rank, region, held: lease.chunks!.get(id)!, memory: targets.get(id)!.memory };
  });
  const multiRank = manifest.data.ranks.length > 1;
  const onGpu = items.filter((x) => onDevice(x.memory));
  const decoded: HostRegion[] = [];
  const decodeOnCpu = async (x: Item): Promise<TransferRegion> => {
    const out = await decodeHeld(lease.buffer, x.region, x.held, manifest.name);
    decoded.push(out);
    return {
      name: multiRank ? `rank ${x.rank}/${x.region.key}` : x.region.key,
      blobPath: `/proc/self/fd/${out.fd}`,
      size: x.region.size,
      chunkSize: x.region.chunkSize,
      checksums: manifest.checksummed ? x.region.checksums : ownChecksums(x.region, out),
      memory: x.memory,
    };
  };
  try {
    // host targets decoded before anything is written anywhere
    const hydrate: TransferRegion[] = [];
    for (const x of items.filter((y) => !onDevice(y.memory))) hydrate.push(await decodeOnCpu(x));
    let gpu: Awaited<ReturnType<typeof restoreOnDevices>> = { bytes: 0, devices: [] };
    let decodedOnDevice = onGpu.length > 0;
    try {
      gpu = await restoreOnDevices(manifest, lease, onGpu, common);
    } catch (err) {
      if (!restoreScratchShortage(err)) throw err;
      decodedOnDevice = false;
      warnDecodedOnCpu(manifest.name, `${onGpu.length} region(s) held coded in the RAM tier`, err);
      for (const x of onGpu) hydrate.push(await decodeOnCpu(x)); // nothing was issued: decoded and checked before anything is written
    }
    const host = hydrate.length ? await runTransfer({ ...common, op: 'hydrate', verifyFirst: true, regions: hydrate }) : undefined;
    return { bytes: gpu.bytes + (host?.bytes ?? 0), devices: [...gpu.devices, ...(host?.devices ?? [])], decodedOnDevice };
  } finally {
    for (const d of decoded) d.close();
  }
}

/**
 * For a capture whose hash was deferred (no checksums yet): the decoded chunks' own, which the
 * hydrate needs; the restore's GPU digest, forced for such a capture, is what checks the bytes.
 */
function ownChecksums(region: RegionInfo, decoded: HostRegion): string[] {
  const chunks = Math.ceil(region.size / region.chunkSize);
  const own: string[] = [];
  for (let i = 0; i < chunks; i++) own.push(native().checksum(decoded.read(i * region.chunkSize, Math.min(region.chunkSize, region.size - i * region.chunkSize))));
  return own;
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
