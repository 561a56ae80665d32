import { invalidArgument, VsnapError } from '../errors.js';
import type { CallOptions, EngineClient, EngineStatus, QueuedRequestsPolicy } from '../engine/engine-client.js';
import { engineControl } from '../engine/control.js';
import { checkSpec, compareResponses, probe, recheck } from './engine-checks.js';
import type { ResponseCheckOptions } from './response-check-options.js';
import type { ExpectedResponse } from '../manifest/types.js';

/**
 * The engine's own tier 0 (vLLM about v0.30+, `release_kv_cache_memory`, PR #44890): the engine
 * pauses, keeps its weights on the GPU and frees only its KV cache; resuming wakes the KV cache.
 * No descriptors leave the engine and nothing is copied, so it needs neither a snapshot nor the
 * SDK holding memory. Unlike the SDK-held tier 0 (`suspendEngine` with `resident`), the
 * weights die with the engine process and cannot be demoted to RAM or the store without waking
 * it: use this for short idle periods of an engine that will come back as it was, and the
 * SDK-held tier 0 (or a plain suspend) where the weights may have to make room.
 */

/**
 * Options of {@link suspendEngineKeepingWeights}.
 * @public
 */
export interface KeepWeightsSuspendOptions {
  /** Record the engine's answer to this check first, for {@link resumeEngineKeptWeights} to check (see {@link ResponseCheckOptions} for the defaults). */
  readonly probe?: ResponseCheckOptions;
  /**
   * Requests the engine still has: `wait` (the default) lets them finish first, `abort` aborts
   * them. vLLM releases the KV cache only with no request queued or running.
   */
  readonly queued?: QueuedRequestsPolicy;
  /** Cancels the operation. */
  readonly signal?: AbortSignal;
}

/**
 * What {@link suspendEngineKeepingWeights} did.
 * @public
 */
export interface KeepWeightsSuspendResult {
  /** `vsnap` (the plugin's routes, through vLLM's engine client) or `dev` (vLLM's dev routes). */
  readonly via: 'vsnap' | 'dev';
  /** Wall time. */
  readonly seconds: number;
  /** The recorded answer, when a probe was asked for. */
  readonly expected?: ExpectedResponse;
}

/** Paused at level 0 with every rank's memory resident (the plugin reports the allocator's tags asleep). */
function pausedResident(status: EngineStatus): boolean {
  return status.ranks.every((r) => r.weightsMapped && Array.isArray(r.asleepTags) && r.asleepTags.length === 0);
}

/**
 * Suspends `client`'s engine with its weights left on the GPU: pause (level 0), then release the
 * KV cache, waiting for or aborting the requests it still has (`queued`). An engine paused at level
 * 0 with its memory resident is released too. After a failure the engine is resumed, never left
 * paused. `E_ENGINE_STATE` when the engine is asleep already, kept requests queued to the end, or
 * has no `release_kv_cache_memory` (older vLLM: use the SDK-held tier 0 instead).
 * @public
 */
export async function suspendEngineKeepingWeights(client: EngineClient, options: KeepWeightsSuspendOptions = {}): Promise<KeepWeightsSuspendResult> {
  const started = performance.now();
  const call: CallOptions = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  if (status.sleeping && !pausedResident(status)) throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} is asleep already: wake it before a weight-resident suspend`, { url: client.baseUrl });
  if (status.sleeping && options.probe) {
    throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} is paused: a probe would wait in its queue; resume it first, or suspend without a probe`, { url: client.baseUrl });
  }
  const queued = options.queued ?? 'wait';
  if (queued !== 'wait' && queued !== 'abort') invalidArgument('queued', "'wait' or 'abort'", queued);
  if (status.features && !status.features.releaseKvCache) {
    throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} runs a vLLM without release_kv_cache_memory (about v0.30+): use the SDK-held tier 0 (suspendEngine with resident)`, {
      url: client.baseUrl,
    });
  }
  const expected = options.probe ? await probe(client, checkSpec({ check: options.probe }), options.signal) : undefined;
  try {
    await control.releaseKvCache(call, queued);
  } catch (err) {
    if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && err.details.status === 409) {
      throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} kept requests queued, so its KV cache was not released (${err.message}); it was resumed. Retry when it is idle, or pass queued: 'abort'`, { url: client.baseUrl }, { cause: err });
    }
    if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && (err.details.status === 404 || err.details.status === 501)) {
      throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} cannot release its KV cache alone (${err.message}): use the SDK-held tier 0 (suspendEngine with resident)`, { url: client.baseUrl }, { cause: err });
    }
    throw err;
  }
  return { via: control.via, seconds: (performance.now() - started) / 1000, ...(expected ? { expected } : {}) };
}

/**
 * Resumes an engine suspended by {@link suspendEngineKeepingWeights}: wakes the KV cache (which
 * resumes the scheduler) and resets the prefix cache. With `expected`, checks the engine gives
 * the same answer to the recorded check, bit for bit (`E_RESPONSE_MISMATCH` if not). Returns the wall time in seconds.
 * @public
 */
export async function resumeEngineKeptWeights(client: EngineClient, options: { readonly expected?: ExpectedResponse; readonly signal?: AbortSignal } = {}): Promise<number> {
  const started = performance.now();
  const call: CallOptions = options.signal ? { signal: options.signal } : {};
  const { control } = await engineControl(client, call);
  await control.wake(['kv_cache'], call);
  await control.resetPrefixCache(call);
  if (options.expected) {
    const actual = await recheck(client, options.expected, options.signal);
    const difference = compareResponses(options.expected, actual, 0);
    if (difference) {
      throw new VsnapError('E_RESPONSE_MISMATCH', `${client.baseUrl} answers differently after resuming with its weights kept (${difference}): check the engine before sending requests`, {
        url: client.baseUrl,
        difference,
        expected: options.expected.tokenIds.slice(0, 16),
        actual: actual.tokenIds.slice(0, 16),
      });
    }
  }
  return (performance.now() - started) / 1000;
}
