import { closeSync } from 'node:fs';

import { toVsnapError } from '../errors.js';
import { FdReceiver, type FdMessage } from '../ipc/fd-receiver.js';

/** One rank's memory handed to the engine: each region's key, address in the worker and size, and its descriptor. @internal */
export interface HandOverRank {
  readonly regions: ReadonlyArray<{ readonly key: string; readonly va: number; readonly size: number }>;
  readonly fds: readonly number[];
}

/** The socket and per-rank nonces a wake passes to the workers (the plugin's `vsnap_adopt`). @internal */
export interface AdoptOffer {
  readonly socket: string;
  readonly nonces: readonly string[];
}

/**
 * Hands weights memory to an engine's workers, to be mapped at its addresses by their next wake of
 * the weights instead of new memory: offers each rank its descriptors on a fresh private socket and
 * runs `wake`, which makes the workers fetch them. Whatever `wake` does, every offer is settled and
 * awaited (no rejection is left unhandled), every descriptor a peer sent is closed, and the socket
 * is closed, which withdraws (and closes the duplicates of) offers nobody took. The caller keeps
 * its own descriptors. Throws what `wake` threw, or why an offer was not taken.
 * @internal
 */
export async function handOver(
  ranks: readonly HandOverRank[],
  wake: (adopt: AdoptOffer) => Promise<void>,
  options: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<void> {
  const receiver = await FdReceiver.listen();
  try {
    const timing = { timeoutMs: options.timeoutMs ?? 120_000, ...(options.signal ? { signal: options.signal } : {}) };
    const offers: Array<{ nonce: string; taken: Promise<FdMessage> }> = [];
    for (const r of ranks) offers.push(receiver.offer({ regions: r.regions.map((x) => ({ key: x.key, va: x.va, size: x.size })) }, r.fds, timing));
    const taken = Promise.allSettled(offers.map((o) => o.taken)); // settled below on every path
    let failure: { error: unknown } | undefined;
    try {
      await wake({ socket: receiver.path, nonces: offers.map((o) => o.nonce) });
    } catch (error) {
      failure = { error };
      receiver.close(); // the engine will not fetch now: withdraw what it did not take
    }
    const results = await taken;
    for (const r of results) if (r.status === 'fulfilled') for (const fd of r.value.fds) closeSync(fd);
    if (failure) throw failure.error;
    const missed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (missed) throw toVsnapError(missed.reason);
  } finally {
    receiver.close();
  }
}
