import type { HeldChunk } from '../cache/coded-tier.js';
import { toVsnapError, VsnapError } from '../errors.js';
import type { RegionInfo } from '../manifest/types.js';
import { native, type NativeHostBuffer, type NativeTransferResult } from '../native/index.js';
import { memoryDevice, toNativeMemory, type RegionMemory } from '../regions/memory.js';
import { namedChunkError } from '../transfer/codec.js';
import { deviceContexts } from '../transfer/contexts.js';

/** GPU memory (decoded on its GPU); anything else is host memory (the host backend: decoded on the CPU). @internal */
export function onDevice(memory: RegionMemory): boolean {
  return memory.kind === 'device' || memory.kind === 'imported' || (memory.kind === 'mapped' && memory.source === 'imported');
}

/** The allocation whose CUDA_ERROR_OUT_OF_MEMORY is a scratch shortage (native/codec/codec_restore.cc). */
const RESTORE_SCRATCH_CALL = 'cuMemAlloc (codec restore scratch)';

/**
 * Whether a GPU decode ({@link decodeOnDevices}) failed for want of device memory for its scratch:
 * raised before anything was issued (no target written), so the same chunks can be decoded on the
 * CPU instead. A woken engine's card is full; this is not an error of the snapshot.
 * @internal
 */
export function restoreScratchShortage(err: unknown): boolean {
  const e = toVsnapError(err);
  return e.code === 'E_CUDA' && e.details.cudaError === 'CUDA_ERROR_OUT_OF_MEMORY' && e.details.call === RESTORE_SCRATCH_CALL;
}

/** Says (a `VSNAP_CODEC` warning) that a restore decodes on the CPU for want of GPU scratch. @internal */
export function warnDecodedOnCpu(snapshot: string, what: string, err: unknown): void {
  process.emitWarning(`restore of '${snapshot}': no GPU memory for the codec's scratch (${(err as Error).message}); ${what} decoded on the CPU instead (slower; every chunk checked against its checksum)`, { code: 'VSNAP_CODEC' });
}

/** A chunk of a region in a HostBuffer, with its index in the region (where it is decoded to). @internal */
export interface PlacedChunk extends HeldChunk {
  readonly index: number;
}

/** Chunks of one region to decode on its GPU from a HostBuffer. @internal */
export interface DeviceDecodeItem {
  readonly region: RegionInfo;
  readonly memory: RegionMemory;
  readonly chunks: readonly PlacedChunk[];
}

/** What {@link decodeOnDevices} did: decoded bytes, its wall time, and each GPU's bytes. @internal */
export interface DeviceDecodeResult {
  readonly rawBytes: number;
  readonly linkBytes: number;
  readonly seconds: number;
  readonly devices: NonNullable<NativeTransferResult['devices']>;
}

/**
 * Decodes chunks held in `buffer` (coded, or raw where `coded` is false) on their regions' GPUs
 * into the regions (native/codec/codec_restore.h): every coded chunk's header and tables are
 * checked on the host before anything is issued, then each crosses the link into one of two device
 * scratch slots and is decoded from there while the next crosses. A damaged chunk is
 * E_CODEC_CORRUPT naming its region, chunk and snapshot; `details.written` true where the kernel
 * found it while writing (the region then holds wrong bytes: the caller fails the restore before
 * any wake, and the restore's GPU digest would catch them too).
 * @internal
 */
export async function decodeOnDevices(buffer: NativeHostBuffer, items: readonly DeviceDecodeItem[], snapshot: string): Promise<DeviceDecodeResult> {
  if (items.length === 0) return { rawBytes: 0, linkBytes: 0, seconds: 0, devices: [] };
  const targets = items.map((x) => {
    const chunks = new Float64Array(x.chunks.length * 5);
    x.chunks.forEach((c, i) => chunks.set([c.at, c.held, c.rawSize, c.index * x.region.chunkSize, c.coded ? 1 : 0], i * 5));
    return { memory: toNativeMemory(x.memory), size: x.region.size, chunks };
  });
  const devices = items.map((x) => memoryDevice(x.memory));
  let result;
  try {
    result = await deviceContexts.use(devices, () => native().codecRestoreHeld({ kind: 'buffer', buffer, offset: 0 }, targets));
  } catch (err) {
    const e = toVsnapError(err);
    const at = typeof e.details.target === 'number' ? items[e.details.target] : undefined;
    if (e.code !== 'E_CODEC_CORRUPT' || !at) throw e;
    const chunk = at.chunks[Number(e.details.chunk)]?.index ?? Number(e.details.chunk);
    const named = namedChunkError(e, { chunk, region: at.region.key, snapshot });
    if (e.details.written !== true) throw named;
    // found by the kernel while it wrote: the target holds wrong bytes, and the restore fails before any wake
    throw new VsnapError(
      'E_CODEC_CORRUPT',
      `chunk ${chunk} of region ${at.region.key} in snapshot ${snapshot} is damaged: ${String(e.details.reason)}. The restore stopped before the engine could use the region; restore again from another copy of the snapshot (\`vsnap verify\` finds the damaged ones) or capture again.`,
      { ...named.details, written: true },
      { cause: e },
    );
  }
  const bytesByDevice = new Map<number, number>();
  items.forEach((x, i) => {
    const d = devices[i];
    const bytes = x.chunks.reduce((n, c) => n + c.rawSize, 0);
    if (d !== undefined) bytesByDevice.set(d, (bytesByDevice.get(d) ?? 0) + bytes);
  });
  return {
    rawBytes: result.rawBytes,
    linkBytes: result.linkBytes,
    seconds: result.seconds,
    devices: [...bytesByDevice].map(([device, bytes]) => ({ device, bytes, seconds: result.seconds })),
  };
}
