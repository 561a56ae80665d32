import type { ExpectedResponse } from '../manifest/types.js';
import { checkOptions } from '../options.js';
import { engineControl } from './control.js';
import { checkSpec, probe, type ResponseCheckOptions } from './response-check.js';
import type { CallOptions, CompletionResult, EngineClientOptions, EngineRegionTable, EngineStatus } from './types.js';
import { EngineWire } from './wire.js';

export type { CallOptions, CompletionResult, EngineClientOptions, EngineDigestTable, EngineRegionTable, EngineStatus, QueuedRequestsPolicy } from './types.js';

/**
 * A client for one engine: the operations a user calls on it, each through the vsnap plugin's
 * authenticated `/vsnap/v1` routes where the engine has them, else through vLLM's dev routes
 * (VLLM_SERVER_DEV_MODE=1). Answers are validated (old and new vLLM forms); failures are
 * `E_ENGINE_HTTP` (with status, route and an excerpt of the body), `E_ENGINE_UNREACHABLE`,
 * `E_ENGINE_PROTOCOL` (an answer of the wrong shape), `E_ENGINE_STATE` (neither route family),
 * `E_TIMEOUT` or `E_ABORTED`. Close it to free its connections.
 * @public
 */
export class EngineClient {
  /** The engine's base URL. */
  readonly baseUrl: string;
  /**
   * The engine's routes one for one (the flows, `serve`'s proxy and `doctor` use them).
   * @internal
   */
  readonly wire: EngineWire;

  constructor(options: EngineClientOptions) {
    this.wire = new EngineWire(options);
    this.baseUrl = this.wire.baseUrl;
  }

  /** True when `/health` answers 200 (vLLM answers 503 only when the engine is dead). */
  async health(options?: CallOptions): Promise<boolean> {
    return this.wire.health(options);
  }

  /** The engine's version string. */
  async version(options?: CallOptions): Promise<string> {
    return this.wire.version(options);
  }

  /** The served model ids. */
  async models(options?: CallOptions): Promise<string[]> {
    return this.wire.models(options);
  }

  /** A completion (`/v1/completions`). Greedy unless the body says otherwise. */
  async completions(body: { prompt: string; max_tokens?: number; temperature?: number; logprobs?: number; seed?: number; model?: string; [key: string]: unknown }, options?: CallOptions): Promise<CompletionResult> {
    return this.wire.completions(body, options);
  }

  /**
   * The engine as the vsnap plugin sees it: its model, whether it sleeps, each worker's devices
   * and abilities, and how its routes were attached.
   */
  async status(options?: CallOptions): Promise<EngineStatus> {
    return (await engineControl(this, options)).status;
  }

  /**
   * Every worker's weights region table (plugins whose status says `describe`), also while the
   * engine is asleep: what a capture would copy, without descriptors.
   */
  async describe(options?: CallOptions): Promise<EngineRegionTable[]> {
    const { control } = await engineControl(this, options);
    return control.describe(options);
  }

  /**
   * Puts the engine to sleep: level 1 moves the weights off the GPU and drops the KV cache;
   * level 2 drops both. `mode` says what happens to requests in flight (vLLM's default when absent).
   */
  async sleep(args: { level?: 1 | 2; mode?: 'abort' | 'wait' | 'keep' } = {}, options?: CallOptions): Promise<void> {
    checkOptions('EngineClient.sleep arguments', args, ['level', 'mode']);
    const { control } = await engineControl(this, options);
    await control.sleep(args.level ?? 1, args.mode, options);
  }

  /** Wakes the engine: the tags given (`weights`, `kv_cache`, `scheduling`), or everything without tags. */
  async wake(args: { tags?: readonly string[] } = {}, options?: CallOptions): Promise<void> {
    checkOptions('EngineClient.wake arguments', args, ['tags']);
    const { control } = await engineControl(this, options);
    await control.wake(args.tags, options);
  }

  /**
   * Drops the engine's prefix cache (stale KV blocks must not be served after its weights
   * changed). An engine with requests running refuses: `E_ENGINE_STATE`.
   */
  async resetPrefixCache(options?: CallOptions): Promise<void> {
    const { control } = await engineControl(this, options);
    await control.resetPrefixCache(options);
  }

  /**
   * The engine's answer to a fixed prompt (greedy, with logprobs), as a capture records it and a
   * restore checks it: `check` picks the prompt and length.
   */
  async expectedResponse(check: ResponseCheckOptions = {}, options?: CallOptions): Promise<ExpectedResponse> {
    checkOptions('EngineClient.expectedResponse check', check, ['prompt', 'mode', 'maxTokens']);
    return probe(this, checkSpec(check), options?.signal);
  }

  /** Frees the client's connections (when it made its own dispatcher). */
  async close(): Promise<void> {
    await this.wire.close();
  }

  /** Same as {@link EngineClient.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
