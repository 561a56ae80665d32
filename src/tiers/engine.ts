import { VsnapError } from '../errors.js';
import type { CallOptions, EngineClient } from '../engine/engine-client.js';
import { engineControl } from '../engine/control.js';
import { checkSpec, compareResponses, probe, recheck } from '../flows/checks.js';
import type { ResponseCheckOptions } from '../flows/response-check.js';
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

/**
 * Suspends `client`'s engine with its weights left on the GPU: pause (level 0, requests kept),
 * then release the KV cache. `E_ENGINE_STATE` when the engine is asleep already or has no
 * `release_kv_cache_memory` (older vLLM: use the SDK-held tier 0 instead).
 * @public
 */
export async function suspendEngineKeepingWeights(client: EngineClient, options: KeepWeightsSuspendOptions = {}): Promise<KeepWeightsSuspendResult> {
  const started = performance.now();
  const call: CallOptions = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  if (status.sleeping) throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} is asleep already: wake it before a weight-resident suspend`, { url: client.baseUrl });
  if (status.features && !status.features.releaseKvCache) {
    throw new VsnapError('E_ENGINE_STATE', `${client.baseUrl} runs a vLLM without release_kv_cache_memory (about v0.30+): use the SDK-held tier 0 (suspendEngine with resident)`, {
      url: client.baseUrl,
    });
  }
  const expected = options.probe ? await probe(client, checkSpec({ check: options.probe }), options.signal) : undefined;
  try {
    await control.releaseKvCache(call);
  } catch (err) {
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
