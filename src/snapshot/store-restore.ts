import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { RegionInfo } from '../manifest/types.js';
import type { NativeTransferResult } from '../native/index.js';
import type { HostRegion } from '../regions/host-region.js';
import { readBlobDecoded } from '../store/coded-blob.js';
import type { RegionStore } from '../store/region-store.js';
import { runTransfer, type TransferOptions } from '../transfer/transfer.js';
import type { RestoreRegion } from './snapshot-types.js';
import { decodesOnDevice, decodeStoreOnDevices, type StoreDecodeItem, type StoreDecodeOptions } from './store-decode.js';

type Common = { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>;

/**
 * A restore straight from the store's blobs: every chunk checked against its checksum before it is
 * written (all of them first with `verifyFirst`). Coded blobs (`RegionInfo.codec`) restored into
 * GPU memory are decoded on the GPU (store-decode.ts, where the snapshot has GPU digests and not
 * with `verifyFirst`): every coded chunk's header checked before anything is written, the decoded
 * bytes compared with the GPU digests by the caller (`decodedOnDevice`: it must, whatever
 * `verifyDigests` says) before any wake. The other coded blobs are decoded on the CPU into memfds
 * first, every chunk checked against its checksum, before any target is written. A damaged coded
 * chunk refuses the restore (E_CODEC_CORRUPT or E_CHECKSUM naming its region and chunk) with
 * nothing written. Where a window of the GPU decode finds no GPU memory for its scratch, the regions
 * it had left are decoded on the CPU the same way (whole, each chunk checked against its checksum)
 * and copied after the GPU's windows; `decodedOnDevice` is true only if some region was restored
 * by the GPU decode alone. Holds the store's shared blob lock throughout.
 * @internal
 */
export async function restoreFromStore(
  store: RegionStore,
  manifest: Manifest,
  targets: ReadonlyMap<string, RestoreRegion>,
  common: Common,
  options: { verifyFirst: boolean; directIo: boolean } & Pick<StoreDecodeOptions, 'windowBytes'>,
): Promise<NativeTransferResult & { decodedOnDevice: boolean }> {
  const multiRank = manifest.data.ranks.length > 1;
  return store.withLock(false, async () => {
    const started = performance.now();
    const decoded = new Map<string, HostRegion>();
    const onGpu: StoreDecodeItem[] = [];
    const onGpuEntries: Array<{ rank: number; region: RegionInfo }> = [];
    const hydrate: Array<{ rank: number; region: RegionInfo }> = [];
    try {
      for (const entry of manifest.regions()) {
        const { rank, region } = entry;
        const memory = targets.get(regionId(rank, region.key))!.memory;
        if (decodesOnDevice(manifest, region, memory, options.verifyFirst)) {
          onGpu.push({ region, path: store.blobPath(region.blob), memory });
          onGpuEntries.push(entry);
          continue;
        }
        hydrate.push(entry);
        common.signal?.throwIfAborted();
        if (region.codec) decoded.set(regionId(rank, region.key), await readBlobDecoded(store.blobPath(region.blob), region, manifest.name));
      }
      // Checked before anything is written: every CPU-decoded chunk above, every GPU-decoded chunk's header here.
      const gpu = await decodeStoreOnDevices(manifest, onGpu, common, { directIo: options.directIo, ...(options.windowBytes !== undefined ? { windowBytes: options.windowBytes } : {}) });
      // No GPU memory for a window's scratch: the regions it left are decoded and checked on the CPU, then copied.
      for (const i of gpu.undecoded) {
        const entry = onGpuEntries[i]!;
        common.signal?.throwIfAborted();
        decoded.set(regionId(entry.rank, entry.region.key), await readBlobDecoded(onGpu[i]!.path, entry.region, manifest.name));
        hydrate.push(entry);
      }
      const gpuRegions = onGpu.length - gpu.undecoded.length;
      const host = hydrate.length > 0 || gpuRegions === 0
        ? await runTransfer({
            ...common,
            op: 'hydrate',
            verifyFirst: options.verifyFirst,
            regions: hydrate.map(({ rank, region }) => {
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
          })
        : undefined;
      if (gpuRegions === 0) return { ...host!, decodedOnDevice: false };
      const devices = new Map<number, { bytes: number; seconds: number }>();
      for (const d of [...gpu.devices, ...(host?.devices ?? [])]) {
        const was = devices.get(d.device);
        devices.set(d.device, { bytes: (was?.bytes ?? 0) + d.bytes, seconds: (was?.seconds ?? 0) + d.seconds });
      }
      return {
        bytes: onGpu.reduce((n, x, i) => n + (gpu.undecoded.includes(i) ? 0 : x.region.size), 0) + (host?.bytes ?? 0),
        seconds: (performance.now() - started) / 1000,
        devices: [...devices].map(([device, d]) => ({ device, ...d })),
        decodedOnDevice: true,
      };
    } finally {
      for (const d of decoded.values()) d.close();
    }
  });
}
