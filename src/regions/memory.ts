import type { DeviceAllocation } from '../gpu/device-allocation.js';
import type { NativeMemorySpec, NativeRegionSet } from '../native/index.js';

/**
 * Where a region's bytes live, for capture (read) or restore (write):
 * - `host`: host memory behind a descriptor (a memfd, e.g. `HostRegion` of vsnap/plumbing); the CPU backend.
 * - `imported`: a descriptor another process exported for its GPU memory (POSIX-FD VMM handle);
 *   mapped for the duration of the transfer only. `device`, the GPU's ordinal in this process
 *   where known, lets a transfer over several GPUs plan its threads (the handle itself says
 *   where the memory is).
 * - `device`: GPU memory this process allocated ({@link DeviceAllocation}).
 * - `mapped`: a `host` or `imported` region already mapped by a `MappedRegions` set of vsnap/plumbing (made
 *   by `MappedRegions.memory`, not by hand), so the operation maps nothing itself.
 * Descriptors are duplicated when a transfer starts; the caller keeps ownership of theirs.
 * @public
 */
export type RegionMemory =
  | { readonly kind: 'host'; readonly fd: number }
  | { readonly kind: 'imported'; readonly fd: number; readonly device?: number }
  | { readonly kind: 'device'; readonly allocation: DeviceAllocation }
  | MappedMemory;

/**
 * A region of a `MappedRegions` set (vsnap/plumbing): `source` is the kind it was opened from.
 * @public
 */
export interface MappedMemory {
  /** Always `mapped`. */
  readonly kind: 'mapped';
  /** The kind of memory the set opened: `host` (a memfd) or `imported` (another process's GPU memory). */
  readonly source: 'host' | 'imported';
  /** @internal */
  readonly set: NativeRegionSet;
  /** @internal */
  readonly index: number;
  /** The GPU's ordinal in this process (imported memory), where known. */
  readonly device?: number;
}

/** @internal */
export function toNativeMemory(memory: RegionMemory): NativeMemorySpec {
  switch (memory.kind) {
    case 'host':
    case 'imported':
      return { kind: memory.kind, fd: memory.fd };
    case 'device':
      return { kind: 'device', allocation: memory.allocation.handle };
    case 'mapped':
      return { kind: 'mapped', set: memory.set, index: memory.index };
  }
}

/** Whether the memory is another process's GPU memory (imported directly or through a set). @internal */
export function isImported(memory: RegionMemory): boolean {
  return memory.kind === 'imported' || (memory.kind === 'mapped' && memory.source === 'imported');
}

/** @internal */
export function memoryDevice(memory: RegionMemory): number | undefined {
  if (memory.kind === 'device') return memory.allocation.device;
  return memory.kind === 'imported' || (memory.kind === 'mapped' && memory.source === 'imported') ? memory.device : undefined;
}
