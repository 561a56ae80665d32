import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { NativeTransferResult } from '../native/index.js';
import type { HostRegion } from '../regions/host-region.js';
import { readBlobDecoded } from '../store/coded-blob.js';
import type { RegionStore } from '../store/region-store.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import type { RestoreRegion } from './snapshot-types.js';

type Common = { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>;

/**
 * A restore straight from the store's blobs: every chunk checked against its checksum before it is
 * written (all of them first with `verifyFirst`). Coded blobs (`RegionInfo.codec`) are decoded on
 * the CPU into memfds first, every chunk checked, before any target is written: a damaged coded
 * chunk refuses the restore (E_CODEC_CORRUPT or E_CHECKSUM naming its region and chunk) with
 * nothing written. Holds the store's shared blob lock throughout.
 * @internal
 */
export async function restoreFromStore(
  store: RegionStore,
  manifest: Manifest,
  targets: ReadonlyMap<string, RestoreRegion>,
  common: Common,
  options: { verifyFirst: boolean; directIo: boolean },
): Promise<NativeTransferResult> {
  const multiRank = manifest.data.ranks.length > 1;
  return store.withLock(false, async () => {
    const decoded = new Map<string, HostRegion>();
    try {
      for (const { rank, region } of manifest.regions()) {
        common.signal?.throwIfAborted();
        if (region.codec) decoded.set(regionId(rank, region.key), await readBlobDecoded(store.blobPath(region.blob), region, manifest.name));
      }
      return await runTransfer({
        ...common,
        op: 'hydrate',
        verifyFirst: options.verifyFirst,
        regions: [...manifest.regions()].map(({ rank, region }) => {
          const memfd = decoded.get(regionId(rank, region.key));
          return {
            name: multiRank ? `rank ${rank}/${region.key}` : region.key,
            blobPath: memfd ? `/proc/self/fd/${memfd.fd}` : store.blobPath(region.blob),
            size: region.size,
            chunkSize: region.chunkSize,
            checksums: region.checksums,
            memory: targets.get(regionId(rank, region.key))!.memory,
          };
        }),
        directIo: options.directIo,
      });
    } finally {
      for (const d of decoded.values()) d.close();
    }
  });
}
