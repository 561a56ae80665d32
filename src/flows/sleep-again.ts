import type { CallOptions, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';

// Putting an engine back to sleep after a failed restore (restore-run.ts).

/**
 * Puts an engine that holds weights back to sleep at level 2. vLLM's executor ignores a sleep while
 * any of its tags is still asleep (vllm/v1/executor/abstract.py `sleep`: "Executor is already
 * sleeping"), so the weights of an engine whose KV cache did not wake are freed only if the KV
 * cache is woken first. That takes the KV cache's memory: `wakeRest` says whether the restore may
 * (false in a swap, whose room gate did not open: the other engine still holds the GPU). Returns
 * whether the weights were let go (false: the sleep was the executor's no-op).
 * @internal
 */
export async function sleepAgain(control: EngineControl, status: EngineStatus, call: CallOptions, wakeRest: boolean): Promise<boolean> {
  const asleep = status.sleeping ? executorTagsAsleep(status) : [];
  if (asleep.length && wakeRest) await control.wake(asleep, call);
  await control.sleep(2, undefined, call);
  return !asleep.length || wakeRest;
}

/**
 * The tags vLLM's executor still counts asleep, by what the allocator reports. The executor tracks
 * `weights` and `kv_cache` only, and skips a whole wake that names a tag it does not count asleep
 * (vllm/v1/executor/abstract.py `wake_up`): never name an awake one. Older plugins do not report
 * the allocator's tags: the KV cache then (the weights are awake: `holdsWeights`).
 */
function executorTagsAsleep(status: EngineStatus): string[] {
  if (status.ranks.every((r) => Array.isArray(r.asleepTags))) {
    const asleep = new Set(status.ranks.flatMap((r) => r.asleepTags ?? []));
    return ['weights', 'kv_cache'].filter((t) => asleep.has(t));
  }
  return ['kv_cache'];
}
