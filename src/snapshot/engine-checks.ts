// What the engine flows check and compare, kept apart from the flows themselves (all @internal).
import { statSync } from 'node:fs';

import { invalidArgument, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import type { ExportedRegions } from '../engine/export.js';
import type { LiveLayout } from '../manifest/compat.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { ResponseCheckOptions } from './response-check-options.js';
import type { Snapshot } from './snapshot.js';

export type { ResponseCheckOptions } from './response-check-options.js';

export const DEFAULT_PROMPT = 'The capital of France is';
const RISKY_BACKENDS = /FLASHINFER/i;

export function warn(options: { onWarning?: (m: string) => void }, message: string): void {
  if (options.onWarning) options.onWarning(message);
  else process.emitWarning(message, { code: 'VSNAP_ENGINE' });
}

export function preflight(status: EngineStatus, options: { onWarning?: (m: string) => void }): void {
  const backend = status.engine.attentionBackend;
  if (backend && RISKY_BACKENDS.test(backend)) {
    warn(
      options,
      `the engine uses the ${backend} attention backend, which keeps workspace outside the sleep-mode allocator: ` +
        'after a wake its output can be fluent but wrong (vllm #31016). Serve with --attention-backend TRITON_ATTN; ' +
        'the expected-response check after each restore will catch the fault.',
    );
  }
  const off = status.ranks.filter((r) => !r.sleepMode);
  if (off.length) {
    const cumem = off.some((r) => r.cumemAllocator);
    throw new VsnapError(
      'E_ENGINE_STATE',
      `the engine runs without sleep mode${cumem ? ' (its weights are in the cumem pool of --enable-cumem-allocator, which is not sleep mode)' : ''}: start it with --enable-sleep-mode`,
      { ranks: off.map((r) => r.rank) },
    );
  }
}

/** The engine, model and platform facts a snapshot must match. */
export function liveFacts(status: EngineStatus, exported: ExportedRegions, allowModelSwap: boolean): Omit<LiveLayout, 'ranks'> {
  const m = status.model;
  const model = allowModelSwap
    ? { dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize }
    : { id: m.id, revision: m.revision, dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize };
  const engine = { kind: status.engine.kind, version: status.engine.version, pluginVersion: status.engine.pluginVersion, attentionBackend: status.engine.attentionBackend };
  const first = exported.ranks[0]!;
  if (first.memory === 'host') return { engine, model, platform: { kind: 'host' } };
  const device = first.gpu; // found by the export
  return {
    engine,
    model,
    platform: { kind: 'cuda', gpuName: device?.name ?? null, computeCapability: device?.computeCapability ?? null, vmmGranularity: device?.vmmGranularity ?? null },
  };
}

export function liveRanks(exported: ExportedRegions): LiveLayout['ranks'] {
  return exported.ranks.map((r) => ({ regions: r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag })) }));
}

/** The check to record: `check` over the older probePrompt / probeMaxTokens options, then the defaults. */
export function checkSpec(options: { check?: ResponseCheckOptions; probePrompt?: string; probeMaxTokens?: number }): Required<ResponseCheckOptions> {
  const mode = options.check?.mode ?? 'prefill';
  const maxTokens = options.check?.maxTokens ?? options.probeMaxTokens ?? (mode === 'prefill' ? 1 : 16);
  if (mode !== 'prefill' && mode !== 'decode') invalidArgument('check.mode', "'prefill' or 'decode'", mode);
  if (!Number.isInteger(maxTokens) || maxTokens < 1) invalidArgument('check.maxTokens', 'an integer >= 1', maxTokens);
  return { prompt: options.check?.prompt ?? options.probePrompt ?? DEFAULT_PROMPT, mode, maxTokens };
}

/** The check a recorded answer was made with (no prompt log-probabilities: a decode check). */
export function checkOf(expected: ExpectedResponse): Required<ResponseCheckOptions> {
  return { prompt: expected.prompt, maxTokens: expected.maxTokens, mode: expected.promptLogprobs ? 'prefill' : 'decode' };
}

/**
 * Records the engine's answer to the check: greedy tokens with their logprobs and, in `prefill`
 * mode, the prompt's token ids and log-probabilities. vLLM's completions route with `echo` and
 * `logprobs` (vllm/frontend/entrypoints/openai/completion/protocol.py `to_sampling_params`:
 * prompt_logprobs = logprobs under echo; serving.py `request_output_to_completion_response`)
 * lists the prompt tokens first, the first with a null logprob; usage.prompt_tokens says where
 * the generated ones start. A request with prompt logprobs skips reading the prefix cache
 * (vllm/frontend/processing/sampling_params.py `skip_reading_prefix_cache`): the whole prompt is
 * computed.
 */
export async function probe(client: EngineClient, check: Required<ResponseCheckOptions>, signal?: AbortSignal): Promise<ExpectedResponse> {
  const { prompt, maxTokens } = check;
  const echo = check.mode === 'prefill';
  const r = await client.completions({ prompt, max_tokens: maxTokens, temperature: 0, logprobs: 1, ...(echo ? { echo: true } : {}) }, signal ? { signal } : {});
  if (!echo) return { prompt, maxTokens, tokenIds: r.tokenIds ?? [], text: r.text, logprobs: r.logprobs };
  const usage = (r.raw as { usage?: { prompt_tokens?: number } }).usage;
  const n = usage?.prompt_tokens;
  const lps = r.logprobs;
  if (typeof n !== 'number' || !lps || lps.length < n || n < 1 || !lps.slice(1).every(Number.isFinite)) {
    throw new VsnapError(
      'E_ENGINE_PROTOCOL',
      `${client.baseUrl} did not score the prompt (a completion with echo and logprobs gave ${lps ? lps.length : 'no'} logprobs for ${n ?? 'an unknown number of'} prompt tokens): ` +
        "use the decode check (check: { mode: 'decode' }) with this engine",
      { url: client.baseUrl, promptTokens: n ?? null, logprobs: lps?.length ?? null },
    );
  }
  const ids = r.tokenIds;
  return {
    prompt,
    maxTokens,
    tokenIds: ids ? ids.slice(n) : [],
    text: r.text.startsWith(prompt) ? r.text.slice(prompt.length) : r.text,
    logprobs: lps.slice(n),
    promptTokenIds: ids ? ids.slice(0, n) : [],
    promptLogprobs: lps.slice(1, n),
  };
}

/**
 * Re-runs the check `expected` was recorded with. The engine answered this very check when the
 * snapshot was taken, so an answer it cannot give in a usable form now (not JSON: Python's json
 * writes NaN and Infinity, which broken weights produce; no prompt log-probabilities, or
 * non-finite ones) says the restored engine does not compute what it did: `E_RESPONSE_MISMATCH`,
 * not a protocol error. (Measured on an H200: one flipped exponent byte of an int8 scale gave
 * NaN log-probabilities.)
 */
export async function recheck(client: EngineClient, expected: ExpectedResponse, signal?: AbortSignal): Promise<ExpectedResponse> {
  try {
    return await probe(client, checkOf(expected), signal);
  } catch (err) {
    if (!(err instanceof VsnapError) || err.code !== 'E_ENGINE_PROTOCOL') throw err;
    throw new VsnapError(
      'E_RESPONSE_MISMATCH',
      `the engine's answer to the check it answered at capture is unusable now (${err.message}): it does not compute what it did when the snapshot was taken`,
      { ...err.details, unusable: true },
      { cause: err },
    );
  }
}

function firstTokenDifference(what: string, expected: readonly number[], actual: readonly number[]): string | undefined {
  const i = expected.findIndex((t, k) => actual[k] !== t);
  if (i < 0 && expected.length === actual.length) return undefined;
  const at = i >= 0 ? i : Math.min(expected.length, actual.length);
  return `${what} ${at} differs: expected ${expected[at]}, got ${actual[at]}`;
}

function worstDifference(expected: readonly number[], actual: readonly number[] | null | undefined): number {
  let worst = expected.length === (actual?.length ?? -1) ? 0 : Number.NaN;
  expected.forEach((lp, k) => {
    worst = Math.max(worst, Math.abs(lp - (actual?.[k] ?? Number.NaN)));
  });
  return worst;
}

/**
 * Where two answers differ, or undefined: token ids exactly (the prompt's, then the generated
 * ones; the text where the engine gives no ids), log-probabilities within `tolerance` (0:
 * bit-identical).
 */
export function compareResponses(expected: ExpectedResponse, actual: ExpectedResponse, tolerance: number): string | undefined {
  if (expected.promptLogprobs) {
    if (expected.promptTokenIds?.length && actual.promptTokenIds?.length) {
      const d = firstTokenDifference('prompt token', expected.promptTokenIds, actual.promptTokenIds);
      if (d) return d;
    }
    const worst = worstDifference(expected.promptLogprobs, actual.promptLogprobs);
    if (!(worst <= tolerance)) return `prompt logprobs differ by up to ${worst} (tolerance ${tolerance})`;
  }
  if (expected.tokenIds.length && actual.tokenIds.length) {
    const d = firstTokenDifference('token', expected.tokenIds, actual.tokenIds);
    if (d) return d;
  } else if (expected.text !== actual.text) {
    return `text differs: expected ${JSON.stringify(expected.text.slice(0, 80))}, got ${JSON.stringify(actual.text.slice(0, 80))}`;
  }
  if (expected.logprobs && actual.logprobs) {
    let worst = 0;
    expected.logprobs.forEach((lp, k) => {
      worst = Math.max(worst, Math.abs(lp - (actual.logprobs![k] ?? Number.NaN)));
    });
    if (!(worst <= tolerance)) return `logprobs differ by up to ${worst} (tolerance ${tolerance})`;
  }
  return undefined;
}

/** Whether an engine holds any weights memory now (awake, or woken part way). */
export function holdsWeights(status: EngineStatus): boolean {
  return !status.sleeping || status.ranks.some((r) => r.weightsMapped);
}

/** The snapshot's blobs that are missing or of the wrong size, as problems. @internal */
export function blobProblems(snapshot: Snapshot): string[] {
  const problems: string[] = [];
  for (const { region } of snapshot.manifest.regions()) {
    let size: number | undefined;
    try {
      size = statSync(snapshot.store.blobPath(region.blob)).size;
    } catch {
      size = undefined;
    }
    if (size !== region.size) problems.push(`blob of region ${JSON.stringify(region.key)} is ${size === undefined ? 'missing' : `${size} bytes, not ${region.size}`}`);
  }
  return problems;
}

/**
 * A stopwatch for phases: each call records the seconds since the previous one under `name`;
 * `restart()` starts the next phase now (time spent in between is not counted).
 */
export function phaseTimer(into: Record<string, number>): ((name: string) => void) & { restart(): void } {
  let mark = performance.now();
  const lap = (name: string): void => {
    const now = performance.now();
    into[name] = (now - mark) / 1000;
    mark = now;
  };
  return Object.assign(lap, { restart: () => void (mark = performance.now()) });
}
