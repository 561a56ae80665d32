import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { native, type NativeDeviceAllocation } from '../native/index.js';

/** Where a CPU-only program goes instead (the same regions, captures and restores, in host memory). */
const HOST_MEMORY_PATH =
  "Without a GPU, use host memory: HostRegion.create(size) from 'vsnap/plumbing', and pass its .memory as the region's memory (examples/capture-restore.mjs does both)";

/** A native error as a VsnapError; one saying CUDA is unavailable also says where a CPU-only program goes. */
function withHostHint(err: unknown): VsnapError {
  const e = toVsnapError(err);
  if (e.code !== 'E_CUDA_UNAVAILABLE') return e;
  return new VsnapError('E_CUDA_UNAVAILABLE', `${e.message}. ${HOST_MEMORY_PATH}`, e.details, { cause: e });
}

/**
 * GPU memory owned by this process, created exportable as a POSIX file descriptor (the kind a
 * peer process can import and map). For embedders that own their memory, and for tests.
 * Holds device memory until {@link DeviceAllocation.close}.
 * @public
 */
export class DeviceAllocation {
  /** @internal */
  readonly handle: NativeDeviceAllocation;

  private constructor(handle: NativeDeviceAllocation) {
    this.handle = handle;
  }

  /**
   * Allocates `size` bytes (rounded up to the VMM granularity) on a device.
   * @param device - the device ordinal in this process
   * @param size - bytes; the allocation's `size` is this rounded up to the granularity
   */
  static async allocate(device: number, size: number): Promise<DeviceAllocation> {
    if (!Number.isInteger(device) || device < 0) invalidArgument('device', 'a device ordinal (integer >= 0)', device);
    if (!Number.isSafeInteger(size) || size <= 0) invalidArgument('size', 'a positive integer byte count', size);
    try {
      return new DeviceAllocation(await native().allocateDevice(device, size));
    } catch (err) {
      throw withHostHint(err);
    }
  }

  /**
   * Allocates one allocation a size on a device, made together: mapped side by side in one
   * address reservation with one access call (per region, a reservation and an access call
   * fewer than {@link DeviceAllocation.allocate}), each exportable on its own. Their memory is
   * freed once every one of them is closed. Nothing stays allocated when it fails.
   * @internal
   */
  static async allocateSet(device: number, sizes: readonly number[]): Promise<DeviceAllocation[]> {
    if (!Number.isInteger(device) || device < 0) invalidArgument('device', 'a device ordinal (integer >= 0)', device);
    if (!Array.isArray(sizes) || sizes.length === 0) invalidArgument('sizes', 'a non-empty array of byte counts', sizes);
    for (const size of sizes) if (!Number.isSafeInteger(size) || size <= 0) invalidArgument('sizes', 'positive integer byte counts', size);
    try {
      return (await native().allocateDeviceSet(device, sizes)).map((h) => new DeviceAllocation(h));
    } catch (err) {
      throw withHostHint(err);
    }
  }

  /** The virtual address in this process. */
  get address(): bigint {
    return this.live().address;
  }
  /** Size in bytes (a multiple of the device's VMM granularity). */
  get size(): number {
    return this.live().size;
  }
  /** The device ordinal. */
  get device(): number {
    return this.live().device;
  }
  /** The allocation as a region's memory (`{ kind: 'device', allocation }`), as `HostRegion.memory` is for host memory. */
  get memory(): { readonly kind: 'device'; readonly allocation: DeviceAllocation } {
    return { kind: 'device', allocation: this };
  }
  /** Whether {@link DeviceAllocation.close} was called. */
  get closed(): boolean {
    return this.handle.closed;
  }

  /** A new POSIX file descriptor for the memory, for another process to import. The caller closes it. */
  exportFd(): number {
    return this.call(() => this.live().exportFd());
  }

  /** Copies `data` to the allocation at `offset` (pageable memory: for set-up and tests, not bulk moves). */
  async write(offset: number, data: Uint8Array): Promise<void> {
    await this.callAsync(() => this.live().write(offset, data));
  }

  /** Copies `length` bytes at `offset` out of the allocation. */
  async read(offset: number, length: number): Promise<Buffer> {
    return this.callAsync(() => this.live().read(offset, length));
  }

  /** Sets `length` bytes at `offset` to `value`. */
  async fill(offset: number, length: number, value: number): Promise<void> {
    await this.callAsync(() => this.live().fill(offset, length, value));
  }

  /** Frees the memory (once no running transfer uses it). Idempotent. */
  close(): void {
    this.handle.close();
  }

  /** Same as {@link DeviceAllocation.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  private live(): NativeDeviceAllocation {
    if (this.handle.closed) throw new VsnapError('E_CLOSED', 'this DeviceAllocation was closed');
    return this.handle;
  }

  private call<T>(fn: () => T): T {
    try {
      return fn();
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  private async callAsync<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw toVsnapError(err);
    }
  }
}
