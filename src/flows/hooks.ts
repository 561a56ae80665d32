import type { Snapshot } from '../snapshot/snapshot.js';
import type { CheckpointBackend } from './deep.js';

/**
 * The flows' seams: where tests inject faults and fakes, and where a swap makes a restore wait
 * for the other engine's sleep. Not public: one object, so no public option type carries them.
 * @internal
 */
export interface FlowHooks {
  /** The process checkpoint calls (default: the driver's, through the addon). */
  readonly checkpoint?: CheckpointBackend;
  /** Told which capture a restore restores, once its snapshot is open (the SwapController marks that one damaged on its faults). */
  readonly opened?: (snapshot: Snapshot) => void;
  /** Runs after the wake, before the expected-response check (tests flip a weights byte here). */
  readonly beforeCheck?: () => Promise<void>;
  /**
   * Awaited before the KV cache wakes (swapEngines: the other engine's sleep, which frees the
   * memory the KV cache takes). A rejection fails the restore, and the engine goes back to sleep.
   */
  readonly beforeKvWake?: () => Promise<void>;
  /**
   * Awaited once, when the restore's copy is over: landed (before the rest of its wake), not
   * needed (a tier-0 adopt, at its finishWake), or failed (first on the failure path, before any
   * clean-up waits for room). swapEngines lets the other engine sleep only then. A rejection fails
   * a restore that was going well; on a failure path it is ignored (the first error is reported).
   */
  readonly afterCopy?: () => Promise<void>;
  /** Awaited by a suspend right before the engine's sleep (swapEngines: the other engine's copy landing). A rejection fails the suspend. */
  readonly beforeSleep?: () => Promise<void>;
}

/**
 * An overlapped swap's gate between the restore's copy and the suspended engine's sleep: the sleep
 * (hooks.beforeSleep) awaits `passed()` until `open()` is called, by the restore's afterCopy or, as
 * a backstop, once the restore settled (idempotent). The memory a sleep frees is cleared by the
 * driver for tens of milliseconds after it returns, and a host-to-device copy beside that runs at
 * about half its rate (bench/vmm-interference.cu, `ofreed-beside`: the copy's first 60 ms at 29.7
 * against 53.5 GB/s alone on an H100); the restore's weights fit beside the other engine (what an
 * overlapped swap asks of the GPU), so holding that memory until the copy is over costs no room.
 * @internal
 */
export interface CopyGate {
  readonly open: () => void;
  readonly passed: () => Promise<void>;
}

/** A closed {@link CopyGate}. @internal */
export function copyGate(): CopyGate {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, passed: () => opened };
}

/**
 * Two engines swapped at once, the one primitive behind swapEngines and the SwapController's swap
 * step: the suspend and the restore start together; the suspended engine's sleep waits for the
 * restore's copy to be over (its `beforeSleep`, the restore's `afterCopy`: a CopyGate, opened at the
 * latest once the restore settled). The restore is handed the suspend's promise, for a KV-cache
 * wake that must wait for the other engine's sleep (`beforeKvWake`, its own to build). Both always
 * settle; their outcomes come back as they are.
 * @internal
 */
export async function swapAtOnce<S, R>(
  suspend: (hooks: FlowHooks) => Promise<S>,
  restore: (hooks: FlowHooks, suspending: Promise<S>) => Promise<R>,
): Promise<[PromiseSettledResult<S>, PromiseSettledResult<R>]> {
  const gate = copyGate();
  const suspending = suspend({ beforeSleep: gate.passed });
  suspending.catch(() => undefined); // settled below
  const restoring = (async () => {
    try {
      return await restore({ afterCopy: async () => gate.open() }, suspending);
    } finally {
      gate.open(); // a restore that ended before its copy (or failed) lets the other engine sleep
    }
  })();
  return Promise.allSettled([suspending, restoring]);
}
