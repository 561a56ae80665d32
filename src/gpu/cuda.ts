import { toVsnapError } from '../errors.js';
import { native } from '../native/index.js';

/**
 * Whether CUDA can be used in this process, and if not, why.
 * @public
 */
export interface CudaStatus {
  /** True when the driver loaded, initialised and sees at least one device. */
  readonly available: boolean;
  /** Why CUDA is unavailable (empty when available). */
  readonly reason: string;
  /** The CUDA version the driver supports, e.g. 13000 for 13.0; 0 when unknown. */
  readonly driverVersion: number;
  /** Whether the driver has the process checkpoint API (r570+), used by deep suspend. */
  readonly checkpointApi: boolean;
}

/**
 * One GPU as the driver reports it.
 * @public
 */
export interface GpuDevice {
  /** The device index in this process (after CUDA_VISIBLE_DEVICES). */
  readonly ordinal: number;
  /** e.g. `NVIDIA H200`. */
  readonly name: string;
  /** "GPU-…", as nvidia-smi prints it: stable across processes, unlike the ordinal. */
  readonly uuid: string;
  /** e.g. `0000:19:00.0`. */
  readonly pciBusId: string;
  /** "major.minor", e.g. "9.0". */
  readonly computeCapability: string;
  /** Bytes of device memory. */
  readonly totalMemory: number;
  /** Free bytes, or null unless asked for (reading it initialises a CUDA context). */
  readonly freeMemory: number | null;
  /** Granularity of exportable VMM allocations (2 MiB on an H200). */
  readonly vmmGranularity: number;
  /** Whether the device supports virtual memory management (cuMemCreate/cuMemMap). */
  readonly vmmSupported: boolean;
  /** Whether VMM memory can be exported as POSIX file descriptors (needed to share regions). */
  readonly posixFdHandlesSupported: boolean;
}

/**
 * Loads and initialises the CUDA driver (once) and reports whether it is usable. Never throws
 * for a missing driver: a machine without a GPU gets `available: false` and the reason.
 * @public
 */
export async function cudaStatus(): Promise<CudaStatus> {
  try {
    const s = await native().cudaStatus();
    return { available: s.available, reason: s.reason, driverVersion: s.driverVersion, checkpointApi: s.checkpointApi };
  } catch (err) {
    throw toVsnapError(err);
  }
}

/**
 * Lists the GPUs this process sees. Throws E_CUDA_UNAVAILABLE without a usable driver.
 * @param options - `freeMemory: true` also reads free memory (initialises each device's context briefly).
 * @public
 */
export async function listDevices(options: { freeMemory?: boolean } = {}): Promise<GpuDevice[]> {
  try {
    return await native().cudaDevices(options.freeMemory ?? false);
  } catch (err) {
    throw toVsnapError(err);
  }
}

/**
 * Formats a driver CUDA version number (13000) as "13.0".
 * @internal
 */
export function formatCudaVersion(v: number): string {
  return v > 0 ? `${Math.floor(v / 1000)}.${Math.floor((v % 1000) / 10)}` : 'unknown';
}
