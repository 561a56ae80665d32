import { abortError, toVsnapError } from '../errors.js';
import { native, type NativeCopyBatch, type NativeCopyQueue } from '../native/index.js';
import { toNativeMemory } from '../regions/memory.js';
import { deviceContexts } from './contexts.js';
import { regionDevices, type TransferRegion } from './transfer.js';

/*
 * A copy from the RAM tier as a queue (native/transfer/copy_queue.h): batches of regions pushed as
 * they become ready land in that order, on one stream per GPU, with no drain between them; each
 * push settles when its last byte has landed. What a restore needs to copy its head while its
 * tail's memory is still being made, and to start before the engine has answered.
 */

/** A batch that landed: seconds since the queue opened. @internal */
export type CopyBatch = NativeCopyBatch;

/** @internal */
export interface CopyQueueOptions {
  readonly signal?: AbortSignal | undefined;
  /** Bytes landed so far (every push counted: a region pushed twice counts twice), about every 256 MiB. */
  readonly onLanded?: ((landed: number) => void) | undefined;
  /** The largest single copy (default 64 MiB): how soon a cancel takes effect. */
  readonly chunkSize?: number;
}

/**
 * An open copy queue. Every region's memory is a device or mapped region (or host memory for the
 * CPU backend) and its bytes a RAM-tier buffer slice (`hostCopy`). The GPUs a batch writes to keep
 * their contexts until it settles (as a transfer's do). A signal that aborts cancels it: what was
 * pushed and not landed rejects with E_ABORTED (once nothing is in flight into it any more).
 * @internal
 */
export class CopyQueue {
  private closing: Promise<void> | undefined;
  private readonly stop: () => void;

  private constructor(
    private readonly queue: NativeCopyQueue,
    private readonly label: string,
    private readonly signal: AbortSignal | undefined,
  ) {
    this.stop = () => queue.cancel();
    signal?.addEventListener('abort', this.stop, { once: true });
  }

  /** Opens a queue. */
  static open(label: string, options: CopyQueueOptions = {}): CopyQueue {
    if (options.signal?.aborted) throw abortError(options.signal, `copy of '${label}'`);
    try {
      return new CopyQueue(new (native().CopyQueue)(label, options.chunkSize, options.onLanded), label, options.signal);
    } catch (err) {
      throw toVsnapError(err);
    }
  }

  /** Queues `regions` (each with its `memory` and RAM-tier `hostCopy`); resolves once their last byte landed. */
  async push(regions: readonly TransferRegion[]): Promise<CopyBatch> {
    const items = regions.map((r) => {
      if (!r.memory || !r.hostCopy) throw new TypeError(`region '${r.name}': a queued copy needs memory and a hostCopy`);
      return { name: r.name, size: r.size, memory: r.memory.kind === 'buffer' ? r.memory : toNativeMemory(r.memory), source: r.hostCopy };
    });
    try {
      return await deviceContexts.use(regionDevices(regions), () => this.queue.push(items));
    } catch (err) {
      const e = toVsnapError(err);
      if (e.code === 'E_ABORTED' && this.signal?.aborted) throw abortError(this.signal, `copy of '${this.label}'`);
      throw e;
    }
  }

  /** Bytes landed so far (a region pushed twice counts twice). */
  get landed(): number {
    return this.queue.bytesLanded;
  }

  /** Stops at the next chunk; what is left rejects with E_ABORTED. */
  cancel(): void {
    this.queue.cancel();
  }

  /** No more pushes: resolves once every batch settled (nothing in flight) and the queue's threads ended. Idempotent. */
  close(): Promise<void> {
    return (this.closing ??= this.queue.close().finally(() => this.signal?.removeEventListener('abort', this.stop)));
  }
}
