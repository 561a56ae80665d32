// The expected-response check: a short greedy completion recorded at capture and re-run after
// every restore, and how two answers are compared.
import { invalidArgument, VsnapError } from '../errors.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { Completer } from './types.js';

/**
 * What the expected-response check sends, recorded at capture and re-run after every restore.
 * @public
 */
export interface ResponseCheckOptions {
  /** The prompt (default "The capital of France is"). */
  readonly prompt?: string;
  /**
   * `prefill` (default): the engine scores the prompt (the log-probability of each prompt token
   * after the first, OpenAI `echo` with `logprobs`; vLLM computes them from the prefill's
   * logits) and generates `maxTokens` greedy tokens. The prefill and the first generated token
   * come from one forward pass, so this checks every weight and the attention path the prompt
   * reaches at the cost of `maxTokens` passes. `decode`: `maxTokens` greedy tokens and their
   * logprobs only (the check before prompt scoring; one pass per token).
   */
  readonly mode?: 'prefill' | 'decode';
  /**
   * Tokens generated: default 1 with `prefill` (one forward pass), 16 with `decode`. With
   * `prefill`, 2 adds one decode step: in vLLM the decode path runs other kernels (CUDA graphs
   * for decode-only batches, the attention backend's decode kernels), which a fault can reach
   * alone.
   */
  readonly maxTokens?: number;
}

export const DEFAULT_PROMPT = 'The capital of France is';

/** The check to record: `check`, then the defaults. */
export function checkSpec(check: ResponseCheckOptions = {}): Required<ResponseCheckOptions> {
  const mode = check.mode ?? 'prefill';
  const maxTokens = check.maxTokens ?? (mode === 'prefill' ? 1 : 16);
  if (mode !== 'prefill' && mode !== 'decode') invalidArgument('check.mode', "'prefill' or 'decode'", mode);
  if (!Number.isInteger(maxTokens) || maxTokens < 1) invalidArgument('check.maxTokens', 'an integer >= 1', maxTokens);
  return { prompt: check.prompt ?? DEFAULT_PROMPT, mode, maxTokens };
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
export async function probe(client: Completer, check: Required<ResponseCheckOptions>, signal?: AbortSignal): Promise<ExpectedResponse> {
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
 * writes NaN and Infinity, which broken weights produce; an error answer saying the numbers could
 * not be rendered, as vLLM's web stack gives; no prompt log-probabilities, or non-finite ones)
 * says the restored engine does not compute what it did: `E_RESPONSE_MISMATCH`,
 * not a protocol error. (Measured on an H200: one flipped exponent byte of an int8 scale gave
 * NaN log-probabilities.)
 */
export async function recheck(client: Completer, expected: ExpectedResponse, signal?: AbortSignal): Promise<ExpectedResponse> {
  try {
    return await probe(client, checkOf(expected), signal);
  } catch (err) {
    if (!(err instanceof VsnapError) || (err.code !== 'E_ENGINE_PROTOCOL' && !nonFiniteAnswer(err))) throw err;
    throw new VsnapError(
      'E_RESPONSE_MISMATCH',
      `the engine's answer to the check it answered at capture is unusable now (${err.message}): it does not compute what it did when the snapshot was taken`,
      { ...err.details, unusable: true },
      { cause: err },
    );
  }
}

/**
 * Whether an HTTP error answer is the engine failing to render non-finite numbers. vLLM's web
 * stack answers with Starlette's `JSONResponse`, whose `render` calls `json.dumps(...,
 * allow_nan=False)`: log-probabilities of NaN (broken weights) raise `ValueError: Out of range
 * float values are not JSON compliant`, which vLLM's exception handlers answer as a 400
 * `BadRequestError` (seen on an H200, 2026-12-02, with one flipped exponent byte: the reference
 * engine on vLLM's route table). A 500 with the same message is taken alike.
 */
function nonFiniteAnswer(err: VsnapError): boolean {
  const { status, body } = err.details;
  return err.code === 'E_ENGINE_HTTP' && (status === 400 || status === 500) && typeof body === 'string' && /float values are not JSON compliant/.test(body);
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

