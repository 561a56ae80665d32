import type { CacheLease } from '../cache/host-cache.js';
import { decodeHeld } from '../cache/coded-tier.js';
import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { NativeTransferResult } from '../native/index.js';
import type { HostRegion } from '../regions/host-region.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import type { RestoreRegion } from './snapshot-types.js';

/**
 * A restore from a RAM-tier entry held coded (HostCacheOptions.codec), on the CPU: every chunk is
 * decoded first (a damaged one refuses with E_CODEC_CORRUPT naming its region and chunk before any
 * target is written), then the decoded bytes go through the transfer engine's hydrate with every
 * chunk checked against its checksum before the first byte is written (`verifyFirst`). Chunks held
 * raw are copied the same way. The GPU digests of the targets are compared afterwards as for any
 * restore.
 * @internal
 */
export async function restoreCoded(
  manifest: Manifest,
  lease: CacheLease,
  targets: ReadonlyMap<string, RestoreRegion>,
  common: { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>,
): Promise<{ bytes: number; devices?: NativeTransferResult['devices'] }> {
  const multiRank = manifest.data.ranks.length > 1;
  const decoded: HostRegion[] = [];
  try {
    const regions = [...manifest.regions()].map(({ rank, region }) => {
      const id = regionId(rank, region.key);
      const out = decodeHeld(lease.buffer, region, lease.chunks!.get(id)!, manifest.name);
      decoded.push(out);
      return {
        name: multiRank ? `rank ${rank}/${region.key}` : region.key,
        blobPath: `/proc/self/fd/${out.fd}`,
        size: region.size,
        chunkSize: region.chunkSize,
        checksums: region.checksums,
        memory: targets.get(id)!.memory,
      };
    });
    const result = await runTransfer({ ...common, op: 'hydrate', verifyFirst: true, regions });
    return { bytes: result.bytes, devices: result.devices };
  } finally {
    for (const d of decoded) d.close();
  }
}
