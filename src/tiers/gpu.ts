import type { GpuTier } from '../cache/gpu-tier.js';
import { toVsnapError, VsnapError } from '../errors.js';
import type { Kept, RestoreRun, SuspendRun, Tier, TierRestore } from './tier.js';

/*
 * Tier 0 held by the SDK (GpuTier): a suspend keeps a reference to every weights region
 * (imported handle and descriptor), so the engine's sleep frees only its KV cache; a restore hands
 * the descriptors back and the engine maps the same memory at the same addresses: no bytes move.
 * Whatever happens, the restore lets go of what was held before the next tier wakes new memory.
 */

/** @internal */
export function gpuTier(resident: GpuTier): Tier {
  return {
    name: 'gpu',
    holds(run) {
      const held = resident.peek(run.client.baseUrl);
      const ranks = run.status.ranks;
      return !!held && !!run.snapshot && held.snapshotId === run.snapshot.id && ranks.every((r) => held.ranks[r.rank]?.pid === r.pid && !r.weightsMapped);
    },
    async restore(run) {
      return restoreHeld(resident, run);
    },
    release(run) {
      // After a success the engine holds its weights again; after a failure the next tier brings them back.
      resident.release(run.client.baseUrl);
    },
    async keep(run: SuspendRun): Promise<Kept> {
      await resident.hold(run.client.baseUrl, run.snapshot.id, await run.exported());
      run.lap('hold');
      return { tier: 'gpu', undo: () => void resident.release(run.client.baseUrl) };
    },
  };
}

/**
 * Wakes the weights by mapping back the memory tier 0 held, then finishes the wake. A failure
 * falls through to the next tier (the engine put back to sleep first, if it mapped weights), except
 * a call-off (E_ABORTED: the other engine of a swap did not sleep), which ends the restore.
 */
async function restoreHeld(resident: GpuTier, run: RestoreRun): Promise<TierRestore | undefined> {
  const name = run.snapshot!.name;
  let failure: VsnapError;
  try {
    const { bytes } = await resident.adopt(run.client.baseUrl, (adopt) => run.control.wake(['weights'], run.call, adopt), run.call);
    run.lap('adoptWeights');
    await run.finishWake();
    return { tier: 'gpu', bytes, finished: true };
  } catch (err) {
    failure = toVsnapError(err);
  }
  if (run.call.signal?.aborted) throw failure;
  if (failure.code === 'E_ABORTED') {
    const { state, asleep } = await run.backToSleep(false); // no room for the KV cache: the other engine did not sleep
    throw new VsnapError('E_ABORTED', `${failure.message}\nRestore of '${name}' from tier 0 called off; ${state}.`, { ...failure.details, recovered: asleep }, { cause: failure });
  }
  run.warn(`tier-0 wake of '${name}' failed (${failure.message}); restoring from the snapshot instead`);
  await run.fallBack(`the tier-0 wake of '${name}'`, failure);
  return undefined;
}
