import { toVsnapError, VsnapError } from '../errors.js';
import type { EngineStatus } from '../engine/engine-client.js';
import { compareResponses, recheck } from '../engine/response-check.js';
import type { ExpectedResponse } from '../manifest/types.js';
import { holdsWeights } from './checks.js';
import { awaitRoom } from './kv-overlap.js';
import { kvWakeOf, type RestoreContext } from './restore-stage.js';
import { TAGS_AFTER_WEIGHTS } from './restore-targets.js';
import { sleepAgain } from './sleep-again.js';

/*
 * How a restore ends: the rest of the engine's wake and the expected-response check once the
 * weights are in, or, after a failure, what it made let go and the engine put back to sleep.
 */

/**
 * Lets go of this process's hold on the engine's weights: the mappings of the hydrate and the
 * handles of memory made here (the engine's own keep the memory). Run while the engine answers the
 * check: unmapping hundreds of regions takes milliseconds the wake need not wait for.
 */
async function letGo(run: RestoreContext): Promise<void> {
  const s = run.stage;
  await Promise.all([s.stage === 'mapped' ? s.mapped.close() : undefined, ...(s.stage === 'filling' || s.stage === 'filled' ? s.memory.splice(0).map((f) => f.close()) : [])]);
}

/**
 * Wakes the KV cache, resets the prefix cache and checks the expected response. The KV cache is
 * woken by name (TAGS_AFTER_WEIGHTS): vLLM's executor counts only `weights` and `kv_cache` asleep and
 * skips a whole wake that names any other tag (vllm/v1/executor/abstract.py `wake_up`); and never a
 * wake of all tags: before vLLM PR #52514 that maps the woken weights a second time
 * (vllm/device_allocator/cumem.py `wake_up`), which fails and unmaps them.
 * @internal
 */
export async function finishWake(run: RestoreContext, expected: ExpectedResponse | null, path: 'restored' | 'recovered'): Promise<void> {
  await run.copyOver(false);
  const kvWake = kvWakeOf(run.stage);
  let resetting: Promise<void>;
  if (kvWake) {
    // Started during the hydrate (overlapKvWake): what is left of it is waited for here.
    await kvWake.done;
    Object.assign(run.phases, kvWake.phases);
    run.lap('wakeKvCacheWait');
    resetting = run.control.resetPrefixCache(run.call);
  } else {
    // The prefix cache is emptied beside the KV cache's wake (and the wait for room before it): it
    // is the scheduler's bookkeeping, not GPU memory, and no request runs in between (the engine
    // runs none while its KV cache sleeps), so the order does not matter and a round trip is saved.
    resetting = run.control.resetPrefixCache(run.call);
    resetting.catch(() => undefined); // awaited below
    try {
      if (run.hooks.beforeKvWake) {
        await awaitRoom(run.hooks.beforeKvWake);
        run.lap('awaitRoom');
      }
      await run.control.wake(TAGS_AFTER_WEIGHTS, run.call);
      run.lap('wakeKvCache');
    } catch (err) {
      await resetting.catch(() => undefined); // no call to the engine outlives the restore
      throw err;
    }
  }
  await resetting;
  run.lap('resetPrefixCache');
  if (!expected) return letGo(run);
  await run.hooks.beforeCheck?.();
  const checking = recheck(run.client, expected, run.options.signal);
  checking.catch(() => undefined); // awaited below
  await letGo(run);
  const actual = await checking;
  run.lap('expectedResponse');
  const difference = compareResponses(expected, actual, run.plan.checks.logprobTolerance);
  if (!difference) return;
  throw new VsnapError(
    'E_RESPONSE_MISMATCH',
    path === 'restored'
      ? `after restoring '${run.name}' the engine's answer differs from the one recorded at capture: ${difference}. ` +
        'The weights verified byte for byte, so state outside the snapshot is wrong (an attention backend such as FlashInfer keeps some).'
      : `after the engine reloaded its weights, its answer differs from the one '${run.name}' recorded at capture: ${difference}. ` +
        'Its checkpoint is not the one the snapshot was taken from (or state outside the weights is wrong).',
    { expected, actual, difference },
  );
}

/** After a tier failed part way: re-reads the engine and puts it back to sleep if it holds weights, for the next tier. @internal */
export async function fallBack(run: RestoreContext, what: string, failure: VsnapError): Promise<void> {
  run.status = await reread(run, what, failure);
  if (!holdsWeights(run.status)) return;
  try {
    await sleepAgain(run.control, run.status, run.call, !run.plan.awaitsRoom);
  } catch (err) {
    const e = toVsnapError(err);
    throw new VsnapError(e.code, `${what} failed (${failure.message}) and putting the engine back to sleep failed too (${e.message}); check it before sending requests`, { ...e.details, recovered: false }, { cause: failure });
  }
  run.status = await reread(run, what, failure);
}

/** Re-reads the engine after a failed step; an engine that no longer answers ends the restore. */
async function reread(run: RestoreContext, what: string, cause: VsnapError): Promise<EngineStatus> {
  try {
    return await run.control.status(run.call);
  } catch (err) {
    const e = toVsnapError(err);
    throw new VsnapError(e.code, `${what} failed (${cause.message}), and the engine no longer answers (${e.message}). Restart it; its snapshot brings the weights back.`, { ...e.details, recovered: false }, { cause: e });
  }
}

/**
 * Reads the engine back and puts it to sleep only if it holds weights (an engine that never woke
 * is left alone); `wakeRest`: see {@link sleepAgain}.
 * @internal
 */
export async function backToSleep(run: RestoreContext, wakeRest: boolean): Promise<{ state: string; asleep: boolean }> {
  let status: EngineStatus;
  try {
    status = await run.control.status();
  } catch (err) {
    return { state: `the engine no longer answers (${(err as Error).message}); restart it`, asleep: false };
  }
  if (!holdsWeights(status)) return { state: 'the engine is asleep', asleep: true };
  try {
    const freed = await sleepAgain(run.control, status, {}, wakeRest);
    return freed
      ? { state: 'the engine was put back to sleep', asleep: true }
      : { state: "the engine is asleep, its weights still mapped (vLLM's executor ignores a sleep while the KV cache is asleep; the next restore or wake frees them)", asleep: true };
  } catch (err) {
    return { state: `putting the engine back to sleep failed too (${(err as Error).message}); check it before sending requests`, asleep: false };
  }
}

/**
 * After a failure: what the stage holds let go (a mapping left would keep the engine's freed
 * weights allocated; memory made here goes once the engine's wake of it is over), a KV wake in
 * flight waited for (a sleep racing it could leave the KV cache awake). Returns the failure's
 * cause: when the hydrate stopped because a wake beside it (or the wait before it) failed, that failure.
 * @internal
 */
export async function cleanUp(run: RestoreContext, err: unknown): Promise<VsnapError> {
  await run.releaseEarly(); // a copy started early and not taken over stops before its memory goes
  const s = run.stage;
  if (s.stage === 'exported' || s.stage === 'mapped') s.exported.close();
  if (s.stage === 'mapped') await s.mapped.close().catch(() => undefined);
  if (s.stage === 'filled') await s.wake.settled; // an engine that mapped it keeps it until it sleeps
  if (s.stage === 'filling' || s.stage === 'filled') await Promise.all(s.memory.splice(0).map((f) => f.close().catch(() => undefined)));
  const kvWake = kvWakeOf(s);
  await kvWake?.settled;
  const e = toVsnapError(err);
  if (e.code !== 'E_ABORTED' || run.call.signal?.aborted) return e;
  const wakeFailure = s.stage === 'filled' ? await s.wake.done.then(() => undefined, (x: unknown) => toVsnapError(x)) : undefined;
  if (wakeFailure) return wakeFailure;
  if (kvWake) return kvWake.done.then(() => e, (x: unknown) => toVsnapError(x));
  return e;
}
