import type { DeviceAllocation } from '../gpu/device-allocation.js';
import type { NativeMemorySpec } from '../native/index.js';

/**
 * Where a region's bytes live, for capture (read) or restore (write):
 * - `host`: host memory behind a descriptor (a memfd, e.g. {@link HostRegion}); the CPU backend.
 * - `imported`: a descriptor another process exported for its GPU memory (POSIX-FD VMM handle);
 *   mapped for the duration of the transfer only. `device`, the GPU's ordinal in this process
 *   where known, lets a transfer over several GPUs plan its threads (the handle itself says
 *   where the memory is).
 * - `device`: GPU memory this process allocated ({@link DeviceAllocation}).
 * Descriptors are duplicated when a transfer starts; the caller keeps ownership of theirs.
 * @public
 */
export type RegionMemory =
  | { readonly kind: 'host'; readonly fd: number }
  | { readonly kind: 'imported'; readonly fd: number; readonly device?: number }
  | { readonly kind: 'device'; readonly allocation: DeviceAllocation };

/** @internal */
export function toNativeMemory(memory: RegionMemory): NativeMemorySpec {
  switch (memory.kind) {
    case 'host':
    case 'imported':
      return { kind: memory.kind, fd: memory.fd };
    case 'device':
      return { kind: 'device', allocation: memory.allocation.handle };
  }
}

/** @internal */
export function memoryDevice(memory: RegionMemory): number | undefined {
  if (memory.kind === 'device') return memory.allocation.device;
  return memory.kind === 'imported' ? memory.device : undefined;
}
