/**
 * `vsnap/plumbing`: the parts below the engine flows, for embedders that move memory themselves:
 * memory regions (host memfds, imported descriptors, device allocations), descriptor passing,
 * the GPUs this process sees, the staging memory vsnap keeps pinned, and the format constants.
 *
 * @packageDocumentation
 */

export { HostRegion } from './regions/host-region.js';
export { MappedRegions, type MappedRegionsOptions } from './regions/mapped.js';
export type { MappedMemory, RegionMemory } from './regions/memory.js';
export { DeviceAllocation } from './gpu/device-allocation.js';
export { listDevices, type GpuDevice } from './gpu/cuda.js';
export { FdReceiver, fetchFds, sendFds, type FdMessage } from './ipc/fd-receiver.js';
export { releaseIdleResources } from './transfer/idle.js';
export { DIGEST_ALGORITHM } from './digest/index.js';
export {
  decodeChunk,
  decodeChunkOnDevice,
  encodeChunk,
  encodeChunkOnDevice,
  inspectChunk,
  type ChunkRef,
  type CodecKind,
  type CodedChunkInfo,
} from './transfer/codec.js';
