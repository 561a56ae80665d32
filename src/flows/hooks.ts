import type { CheckpointBackend } from './deep.js';

/**
 * The flows' seams: where tests inject faults and fakes, and where a swap makes a restore wait
 * for the other engine's sleep. Not public: one object, so no public option type carries them.
 * @internal
 */
export interface FlowHooks {
  /** The process checkpoint calls (default: the driver's, through the addon). */
  readonly checkpoint?: CheckpointBackend;
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
