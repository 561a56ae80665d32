import { closeSync, readSync, writeSync } from 'node:fs';

import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { native } from '../native/index.js';

/**
 * Host memory with a file descriptor (a Linux memfd): the host backend of the transfer engine.
 * It stands in for GPU memory where there is none (CPU demo and tests), and is passed between
 * processes over the same socket as GPU handles. Close it to free the memory.
 * @public
 */
export class HostRegion {
  /** The memfd; valid until {@link HostRegion.close}. */
  readonly fd: number;
  /** Size in bytes. */
  readonly size: number;
  private open = true;

  private constructor(fd: number, size: number) {
    this.fd = fd;
    this.size = size;
  }

  /** Creates a zero-filled region of `size` bytes. */
  static create(size: number, name = 'vsnap-region'): HostRegion {
    if (!Number.isSafeInteger(size) || size < 0) invalidArgument('size', 'a non-negative integer byte count', size);
    try {
      return new HostRegion(native().createMemfd(name, size), size);
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  /** Wraps a descriptor received from another process (this object then owns it). */
  static fromFd(fd: number): HostRegion {
    try {
      return new HostRegion(fd, native().fdSize(fd));
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  /** The region as transfer memory (`{ kind: 'host', fd }`), as `DeviceAllocation.memory` is for GPU memory. */
  get memory(): { readonly kind: 'host'; readonly fd: number } {
    this.check(0, 0);
    return { kind: 'host', fd: this.fd };
  }

  /** Writes `data` at `offset`. */
  write(offset: number, data: Uint8Array): void {
    this.check(offset, data.byteLength);
    let done = 0;
    while (done < data.byteLength) done += writeSync(this.fd, data, done, data.byteLength - done, offset + done);
  }

  /** Reads `length` bytes at `offset`. */
  read(offset: number, length: number): Buffer {
    this.check(offset, length);
    const out = Buffer.allocUnsafe(length);
    let done = 0;
    while (done < length) {
      const n = readSync(this.fd, out, done, length - done, offset + done);
      if (n === 0) throw new VsnapError('E_IO', `host region ended at byte ${offset + done}`);
      done += n;
    }
    return out;
  }

  /** Frees the memory (once no running transfer still maps it). Idempotent. */
  close(): void {
    if (!this.open) return;
    this.open = false;
    closeSync(this.fd);
  }

  /** Same as {@link HostRegion.close}, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  private check(offset: number, length: number): void {
    if (!this.open) throw new VsnapError('E_CLOSED', 'this HostRegion was closed');
    if (!Number.isSafeInteger(offset) || offset < 0 || !Number.isSafeInteger(length) || length < 0 || offset + length > this.size) {
      throw new VsnapError('E_OUT_OF_RANGE', `[${offset}, +${length}) is outside a ${this.size}-byte host region`);
    }
  }
}
