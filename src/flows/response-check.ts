// The expected-response check's options (public; kept apart from engine-checks.ts, which is internal).

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
