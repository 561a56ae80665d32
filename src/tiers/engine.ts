import { invalidArgument, VsnapError } from '../errors.js';
import type { CallOptions, EngineClient, EngineStatus, QueuedRequestsPolicy } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import { checkSpec, compareResponses, probe, recheck, type ResponseCheckOptions } from '../engine/response-check.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { Tier } from './tier.js';

/*
 * The engine's own tier 0 (vLLM about v0.30+, `release_kv_cache_memory`, PR #44890): the engine
 * pauses, keeps its weights on the GPU and frees only its KV cache; the restore wakes the KV cache.
 * No descriptors leave the engine and nothing is copied, so it needs neither a snapshot nor the
 * SDK holding memory. Unlike the SDK-held tier 0 (gpu.ts), the weights die with the engine process
 * and cannot be demoted to RAM or the store without waking it: for short idle periods of an
 * engine that comes back as it was.
 *
 * A restore from it never falls through to another tier: the weights it kept are the engine's
 * current ones (they may have changed since any snapshot, as an RL trainer's do), so neither a
 * snapshot's expected response nor its bytes may replace them.
 */

/**
 * The engine's own tier 0, in {@link EngineTiers.engine}: `true`, or with what to check.
 * @public
 */
export interface EngineTierOptions {
  /** At suspend: record the engine's answer to this check first (see {@link ResponseCheckOptions} for the defaults); the suspend's result carries it. */
  readonly check?: ResponseCheckOptions;
  /** At restore: the answer recorded at suspend, checked bit for bit after the KV cache woke (E_RESPONSE_MISMATCH if it differs). */
  readonly expected?: ExpectedResponse;
  /**
   * At suspend, the requests the engine still has: `wait` (the default) lets them finish first,
   * `abort` aborts them. vLLM releases the KV cache only with no request queued or running
   * (vllm/v1/engine/core.py `release_kv_cache_memory`).
   */
  readonly queued?: QueuedRequestsPolicy;
}

/** @internal */
export function engineTier(options: EngineTierOptions): Tier {
  return {
    name: 'engine',
    // Asleep with every rank's weights still mapped: paused with the KV cache released.
    holds: (run) => run.status.sleeping && run.status.ranks.every((r) => r.weightsMapped),
    async restore(run) {
      await run.control.wake(['kv_cache'], run.call);
      run.lap('wakeKvCache');
      await run.control.resetPrefixCache(run.call);
      run.lap('resetPrefixCache');
      if (options.expected) {
        await checkKept(run.client, options.expected, run.call.signal);
        run.lap('expectedResponse');
      }
      return { tier: 'engine', bytes: 0, finished: true };
    },
  };
}

/** Paused at level 0 with every rank's memory resident (the plugin reports the allocator's tags asleep). */
function pausedResident(status: EngineStatus): boolean {
  return status.ranks.every((r) => r.weightsMapped && Array.isArray(r.asleepTags) && r.asleepTags.length === 0);
}

/**
 * Suspends the engine with its weights left on the GPU: pause (level 0), then release the KV
 * cache, waiting for or aborting the requests it still has (`queued`). An engine paused at level 0
 * with its memory resident is released too. After a failure the engine is resumed, never left
 * paused. E_ENGINE_STATE when the engine is asleep already, kept requests queued to the end, or
 * has no `release_kv_cache_memory` (older vLLM: use the SDK-held tier 0 instead). Returns the
 * recorded answer when a check was asked for. @internal
 */
export async function keepInEngine(client: EngineClient, control: EngineControl, status: EngineStatus, options: EngineTierOptions, call: CallOptions): Promise<ExpectedResponse | undefined> {
  if (status.sleeping && !pausedResident(status)) throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} is asleep already: wake it before a weight-resident suspend`, { url: client.baseUrl });
  if (status.sleeping && options.check) {
    throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} is paused: a check would wait in its queue; resume it first, or suspend without a check`, { url: client.baseUrl });
  }
  const queued = options.queued ?? 'wait';
  if (queued !== 'wait' && queued !== 'abort') invalidArgument('tiers.engine.queued', "'wait' or 'abort'", queued);
  if (status.features && !status.features.releaseKvCache) {
    throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} runs a vLLM without release_kv_cache_memory (about v0.30+): use the SDK-held tier 0 (tiers.gpu)`, { url: client.baseUrl });
  }
  const expected = options.check ? await probe(client, checkSpec(options.check), call.signal) : undefined;
  try {
    await control.releaseKvCache(call, queued);
  } catch (err) {
    if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && err.details.status === 409) {
      throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} kept requests queued, so its KV cache was not released (${err.message}); it was resumed. Retry when it is idle, or pass tiers.engine: { queued: 'abort' }`, { url: client.baseUrl }, { cause: err });
    }
    if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && (err.details.status === 404 || err.details.status === 501)) {
      throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} cannot release its KV cache alone (${err.message}): use the SDK-held tier 0 (tiers.gpu)`, { url: client.baseUrl }, { cause: err });
    }
    throw err;
  }
  return expected;
}

async function checkKept(client: EngineClient, expected: ExpectedResponse, signal: AbortSignal | undefined): Promise<void> {
  const actual = await recheck(client, expected, signal);
  const difference = compareResponses(expected, actual, 0);
  if (difference) {
    throw new VsnapError('E_RESPONSE_MISMATCH', `${client.baseUrl} answers differently after resuming with its weights kept (${difference}): check the engine before sending requests`, {
      url: client.baseUrl,
      difference,
      expected: expected.tokenIds.slice(0, 16),
      actual: actual.tokenIds.slice(0, 16),
    });
  }
}
