import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import type { EngineClient } from '../engine/engine-client.js';
import type { RegionStore } from '../store/region-store.js';
import { swapAtOnce, type FlowHooks } from './hooks.js';
import { restoreEngineWith } from './restore.js';
import { suspendEngineWith } from './suspend.js';
import type { EngineRestoreOptions, EngineRestoreReport, EngineSuspendOptions, EngineSuspendResult, SnapshotRef } from './types.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import type { EngineTiers } from '../tiers/index.js';

/**
 * How much of a swap runs at once (see {@link swapEngines}).
 * @public
 */
export type SwapOverlap = 'none' | 'weights' | 'all';

/**
 * Options of {@link swapEngines}.
 * @public
 */
export interface EngineSwapOptions {
  /** The engine to put to sleep, and how ({@link (suspendEngine:1)}'s options). */
  readonly suspend: EngineSuspendOptions & {
    readonly client: EngineClient;
    /** Its snapshot's store (default: the store of `restore.source`). */
    readonly store?: RegionStore;
    /** Its snapshot's name in that store. */
    readonly name: string;
  };
  /** The engine to bring back, and how ({@link restoreEngine}'s options). */
  readonly restore: EngineRestoreOptions & {
    readonly source: Snapshot | SnapshotRef;
    readonly client: EngineClient;
  };
  /**
   * `none`: the suspend, then the restore. `weights` (the default): both at once up to the
   * restored engine's KV-cache wake, which waits for the other engine's sleep: for a GPU that
   * holds the new engine's weights beside the old engine, but not both KV caches. `all`: both
   * fully at once, for a GPU (or GPUs) that hold both engines awake. With either, the suspended
   * engine's sleep waits for the restore's copy to be over (memory freed beside a copy slows it).
   */
  readonly overlap?: SwapOverlap;
}

/**
 * What a swap did.
 * @public
 */
export interface EngineSwapReport {
  /** The overlap it ran with. */
  readonly overlap: SwapOverlap;
  /** Wall time, from the start to both engines done. */
  readonly seconds: number;
  /**
   * Seconds: `suspend` and `restore` (each from the swap's start to its end; with overlap they
   * run at once), and `awaitSuspend`: how long the restore waited for the other engine's sleep
   * before its KV cache woke (`weights` only).
   */
  readonly phases: Readonly<Record<string, number>>;
  /** The suspend's own report. */
  readonly suspend: EngineSuspendResult;
  /** The restore's own report. */
  readonly restore: EngineRestoreReport;
}

/** What an engine is, read after a failure, in words. */
async function stateOf(client: EngineClient): Promise<string> {
  try {
    return (await client.wire.isSleeping()) ? 'asleep' : 'awake';
  } catch (err) {
    return `not answering (${toVsnapError(err).code})`;
  }
}

/**
 * Swaps two engines that share a GPU: puts one to sleep ({@link (suspendEngine:1)}) and brings the
 * other back ({@link restoreEngine}), overlapping the two as far as `overlap` allows, so the
 * swap takes about the longer of the two rather than their sum. With `weights`, the restored
 * engine's KV cache never wakes into memory the suspended engine still holds.
 *
 * Failures: when the suspend fails under `weights`, the restore stops before its KV cache wakes
 * and that engine is put back to sleep (under `all` it completes: both fit); when the restore
 * fails, the suspend still completes (that engine's snapshot was checked before it slept, so
 * nothing is lost, and the GPU is free for a retry), as in a swap without overlap. Either way
 * the error (the failing step's code) says what each engine is now (`details.suspended`,
 * `details.restored`: `asleep`, `awake` or not answering) and carries the report of the step
 * that did complete (`details.suspendResult`, `details.restoreReport`).
 * @public
 */
export async function swapEngines(options: EngineSwapOptions): Promise<EngineSwapReport> {
  const overlap = options.overlap ?? 'weights';
  if (overlap !== 'none' && overlap !== 'weights' && overlap !== 'all') invalidArgument('overlap', "'none', 'weights' or 'all'", overlap);
  const { client: aClient, store: aStore, name, ...suspendOptions } = options.suspend;
  const { source, client: bClient, ...restoreOptions } = options.restore;
  if (aClient.baseUrl === bClient.baseUrl) invalidArgument('restore.client', 'another engine than suspend.client', bClient.baseUrl);
  if ((suspendOptions.tiers as EngineTiers | undefined)?.engine) invalidArgument('suspend.tiers.engine', 'absent: a swap suspends into a snapshot', true);
  const store = aStore ?? source.store;
  const started = performance.now();
  const since = (): number => (performance.now() - started) / 1000;
  const phases: Record<string, number> = {};
  let suspendResult: EngineSuspendResult | undefined;
  let suspendError: VsnapError | undefined;
  let restoreReport: EngineRestoreReport | undefined;
  let restoreError: VsnapError | undefined;
  const suspend = async (hooks: FlowHooks): Promise<EngineSuspendResult> => {
    try {
      return (await suspendEngineWith(store, name, aClient, suspendOptions, hooks)) as EngineSuspendResult; // not the engine's own tier: it has its snapshot
    } finally {
      phases.suspend = since();
    }
  };
  const restore = async (hooks: FlowHooks): Promise<EngineRestoreReport> => {
    try {
      return await restoreEngineWith(source, bClient, restoreOptions, hooks);
    } finally {
      phases.restore = since();
    }
  };
  if (overlap === 'none') {
    // Serial: a failed suspend leaves the other engine asleep, as it was.
    try {
      suspendResult = await suspend({});
      restoreReport = await restore({});
    } catch (err) {
      if (suspendResult) restoreError = toVsnapError(err);
      else suspendError = toVsnapError(err);
    }
  } else {
    // Under `weights` the restored engine's KV cache wakes only once the other engine slept.
    const afterSleep = async (suspending: Promise<EngineSuspendResult>): Promise<void> => {
      const waited = performance.now();
      const e = await suspending.then(() => undefined, (x: unknown) => toVsnapError(x));
      phases.awaitSuspend = (performance.now() - waited) / 1000;
      if (e) throw new VsnapError(e.code, `the other engine's suspend failed (${e.message}), so this engine's KV cache may not wake into the memory it still holds`, { ...e.details }, { cause: e });
    };
    const [s, r] = await swapAtOnce(suspend, (hooks, suspending) => restore(overlap === 'weights' ? { ...hooks, beforeKvWake: () => afterSleep(suspending) } : hooks));
    if (s.status === 'fulfilled') suspendResult = s.value;
    else suspendError = toVsnapError(s.reason);
    if (r.status === 'fulfilled') restoreReport = r.value;
    else restoreError = toVsnapError(r.reason);
  }
  const seconds = since();
  if (suspendResult && restoreReport) return { overlap, seconds, phases, suspend: suspendResult, restore: restoreReport };
  const [suspended, restored] = await Promise.all([stateOf(aClient), stateOf(bClient)]);
  const states = `The suspended engine (${aClient.baseUrl}) is ${suspended}; the restored one (${bClient.baseUrl}) is ${restored}.`;
  const details = {
    suspended,
    restored,
    ...(suspendResult ? { suspendResult } : {}),
    ...(restoreReport ? { restoreReport } : {}),
    ...(suspendError ? { suspendError } : {}),
    ...(restoreError ? { restoreError } : {}),
  };
  const first = suspendError ?? restoreError!;
  const what = suspendError
    ? `suspending '${name}' failed (${suspendError.message})${restoreError ? `, and the restore failed too (${restoreError.message})` : overlap === 'none' ? '; nothing was restored' : ''}`
    : `the restore failed (${restoreError!.message}); the suspend of '${name}' completed`;
  throw new VsnapError(first.code, `swap: ${what}. ${states} Retry the swap once the cause is fixed.`, details, { cause: first });
}
