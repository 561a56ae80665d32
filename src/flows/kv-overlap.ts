import { toVsnapError, VsnapError } from '../errors.js';
import type { EngineControl } from '../engine/control.js';

/*
 * The KV-cache wake of a restore, started while the hydrate still runs (restoreEngine's
 * `overlapKvWake`). The hydrate is the SDK's own copy into memory the engine already mapped; the
 * KV wake is the engine's work (new memory for the KV cache), so the two truly run at once.
 *
 * What vLLM does when the KV cache wakes (read 2026-12-01): vllm/v1/engine/core.py
 * `EngineCore.wake_up` drops a `scheduling` tag whenever other tags are given, wakes the
 * executor's memory of those tags, and resumes the scheduler as soon as no executor memory is
 * asleep; vllm/v1/executor/abstract.py tracks only `weights` and `kv_cache`. With the weights
 * already awake for the hydrate, no wake of the KV cache leaves scheduling paused: the engine
 * schedules again before the hydrate ends. Hence the option is opt-in, for callers that keep
 * every request away from the engine until the restore resolves (the SwapController does).
 */

/** A KV-cache wake in flight. @internal */
export interface EarlyWake {
  /** Resolves when the wake is done; rejects with its error (or the error of the wait before it). */
  readonly done: Promise<void>;
  /** Settles with `done`, never rejects: what a failure path awaits before putting the engine back to sleep. */
  readonly settled: Promise<void>;
  /** Seconds of `awaitRoom` (the wait before the wake, when there was one) and `wakeKvCache`, once done. */
  readonly phases: Readonly<Record<string, number>>;
}

/**
 * Awaits `before` (restoreEngine's beforeKvWake). Its failure (the other engine of a swap did not
 * sleep) is E_ABORTED, whatever its own code: it says nothing of this engine or its snapshot, so
 * it must never start a recovery or mark the snapshot damaged.
 * @internal
 */
export async function awaitRoom(before: () => Promise<void>): Promise<void> {
  try {
    await before();
  } catch (err) {
    const e = toVsnapError(err);
    throw new VsnapError('E_ABORTED', `called off before the KV cache woke: ${e.message}`, { reason: e.code }, { cause: e });
  }
}

/**
 * Starts the wake of `tags` now: after `after` (the wake of the weights, when it runs beside the
 * hydrate too; its failure is this wake's, and nothing more is woken) and `before` (the wait for
 * room, in a swap) resolve, if given. `onFail` is told at once when it fails (the restore then
 * stops its hydrate).
 * @internal
 */
export function startKvWake(
  control: EngineControl,
  tags: readonly string[],
  call: { signal?: AbortSignal },
  before: (() => Promise<void>) | undefined,
  onFail: (error: VsnapError) => void,
  after?: Promise<void>,
): EarlyWake {
  const phases: Record<string, number> = {};
  const run = async (): Promise<void> => {
    if (after) await after;
    let mark = performance.now();
    if (before) {
      await awaitRoom(before);
      const now = performance.now();
      phases.awaitRoom = (now - mark) / 1000;
      mark = now;
    }
    await control.wake(tags, call);
    phases.wakeKvCache = (performance.now() - mark) / 1000;
  };
  const done = run().catch((err: unknown) => {
    const e = toVsnapError(err);
    onFail(e);
    throw e;
  });
  const settled = done.then(
    () => undefined,
    () => undefined,
  );
  return { done, settled, phases };
}
