// The pieces a staged copy from the RAM tier is made of (copy-overlap.ts), apart so that the types
// of a restore's options (snapshot-types.ts) can name a copy started early (early-restore.ts).

import type { CopyBatch, CopyQueue } from '../transfer/copy-queue.js';
import type { TransferRegion } from '../transfer/transfer.js';

/** One region of a staged copy, named by its region id. @internal */
export interface CopyItem {
  readonly id: string;
  readonly region: TransferRegion;
}

/**
 * A copy whose first stage is queued already (startCopy): what copyInStages goes on with.
 * @internal
 */
export interface StartedCopy {
  readonly queue: CopyQueue;
  /** The first stage's items, queued. */
  readonly first: readonly CopyItem[];
  /** Settles once the first stage landed (never rejects unhandled: a handler is attached). */
  readonly landed: Promise<CopyBatch>;
  /** performance.now() when the queue opened. */
  readonly started: number;
  /** Every push so far, for the summary. */
  readonly batches: Promise<CopyBatch>[];
  /** Cancels what was queued and waits until nothing is in flight (the queue closed). */
  abandon(): Promise<void>;
}

