import { setTimeout as sleep } from 'node:timers/promises';

import { Agent, errors as undiciErrors, request, type Dispatcher } from 'undici';
import type { z } from 'zod';

import { abortError, invalidArgument, VsnapError } from '../errors.js';
import {
  CollectiveRpcSchema,
  CompletionSchema,
  IsSleepingSchema,
  ModelListSchema,
  ReleaseKvCacheSchema,
  ResetPrefixCacheSchema,
  SleepAnswerSchema,
  VersionSchema,
  VsnapDescribeSchema,
  VsnapDigestSchema,
  VsnapExportSchema,
  VsnapStatusSchema,
  RUST_FRONTEND_HINT,
  WakeAnswerSchema,
} from './schemas.js';
import type { CallOptions, CompletionResult, EngineClientOptions, EngineDigestTable, EngineRegionTable, EngineStatus, QueuedRequestsPolicy } from './types.js';


const LONG_CALL_MS = 10 * 60_000;

interface Call {
  method: 'GET' | 'POST';
  path: string;
  query?: Record<string, string | number | string[]>;
  body?: unknown;
  auth?: 'vsnap' | 'api';
  idempotent?: boolean;
  options?: CallOptions;
  defaultTimeoutMs?: number;
}

/**
 * What the flows drive an engine through: its URL and its routes.
 * @internal
 */
export interface WireClient {
  readonly baseUrl: string;
  readonly wire: EngineWire;
}

/**
 * The engine's HTTP routes one for one, as the flows drive them: vLLM's (health, version, models,
 * completions, and the dev routes sleep, wake_up, is_sleeping, collective_rpc,
 * reset_prefix_cache, release_kv_cache_memory) and the vsnap plugin's authenticated `/vsnap/v1`
 * routes. Answers are validated (old and new vLLM forms); failures are `E_ENGINE_HTTP` (with
 * status, route and an excerpt of the body), `E_ENGINE_UNREACHABLE`, `E_ENGINE_PROTOCOL`,
 * `E_TIMEOUT` or `E_ABORTED`. Users hold an EngineClient, which picks the route.
 * @internal
 */
export class EngineWire {
  /** The engine's base URL. */
  readonly baseUrl: string;
  private readonly options: EngineClientOptions;
  private readonly dispatcher: Dispatcher;
  private readonly ownsDispatcher: boolean;

  constructor(options: EngineClientOptions) {
    if (typeof options?.baseUrl !== 'string' || !/^https?:\/\//.test(options.baseUrl)) {
      invalidArgument('baseUrl', 'an http(s) URL', options?.baseUrl);
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.options = options;
    this.ownsDispatcher = options.dispatcher === undefined;
    this.dispatcher = options.dispatcher ?? new Agent({ keepAliveTimeout: 10_000, connections: 8 });
  }

  /** True when `/health` answers 200 (vLLM answers 503 only when the engine is dead). */
  async health(options?: CallOptions): Promise<boolean> {
    try {
      await this.call({ method: 'GET', path: '/health', idempotent: true, ...(options ? { options } : {}) });
      return true;
    } catch (err) {
      if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP') return false;
      throw err;
    }
  }

  /** The engine's version string. */
  async version(options?: CallOptions): Promise<string> {
    return this.json(VersionSchema, { method: 'GET', path: '/version', idempotent: true, options }).then((v) => v.version);
  }

  /** The served model ids. */
  async models(options?: CallOptions): Promise<string[]> {
    return this.json(ModelListSchema, { method: 'GET', path: '/v1/models', auth: 'api', idempotent: true, options }).then((m) => m.data.map((d) => d.id));
  }

  /** vLLM's `/is_sleeping` (dev route): true until every tag is awake. */
  async isSleeping(options?: CallOptions): Promise<boolean> {
    return this.json(IsSleepingSchema, { method: 'GET', path: '/is_sleeping', idempotent: true, options }).then((r) => r.is_sleeping);
  }

  /** vLLM's `/sleep` (dev route). */
  async sleep(args: { level?: 0 | 1 | 2; mode?: 'abort' | 'wait' | 'keep' } = {}, options?: CallOptions): Promise<void> {
    const query: Record<string, number | string> = { level: args.level ?? 1 };
    if (args.mode) query.mode = args.mode;
    await this.optionalJson(SleepAnswerSchema, { method: 'POST', path: '/sleep', query, options, defaultTimeoutMs: LONG_CALL_MS });
  }

  /** vLLM's `/wake_up` (dev route); no tags wakes everything. */
  async wakeUp(args: { tags?: readonly string[] } = {}, options?: CallOptions): Promise<void> {
    await this.optionalJson(WakeAnswerSchema, {
      method: 'POST',
      path: '/wake_up',
      ...(args.tags ? { query: { tags: [...args.tags] } } : {}),
      options,
      defaultTimeoutMs: LONG_CALL_MS,
    });
  }

  /** vLLM's `/collective_rpc` (dev route): one result per worker, or null when the method returned None. */
  async collectiveRpc(method: string, args: { args?: unknown[]; kwargs?: Record<string, unknown>; timeout?: number } = {}, options?: CallOptions): Promise<unknown[] | null> {
    const answer = await this.optionalJson(CollectiveRpcSchema, {
      method: 'POST',
      path: '/collective_rpc',
      body: { method, args: args.args ?? [], kwargs: args.kwargs ?? {}, timeout: args.timeout ?? null },
      options,
      defaultTimeoutMs: LONG_CALL_MS,
    });
    return answer ? answer.results : null;
  }

  /**
   * vLLM's `/reset_prefix_cache` (dev route). Newer vLLM answers `{"success": bool}`: false (the
   * engine had requests running) is `E_ENGINE_STATE`, since stale KV blocks could be served.
   */
  async resetPrefixCache(options?: CallOptions): Promise<void> {
    const answer = await this.optionalJson(ResetPrefixCacheSchema, { method: 'POST', path: '/reset_prefix_cache', options });
    if (answer && !answer.success) {
      throw new VsnapError('E_ENGINE_STATE', `${this.baseUrl} did not reset its prefix cache (requests running?): drain the engine and retry`, { url: this.baseUrl });
    }
  }

  /**
   * vLLM's `/release_kv_cache_memory` (dev route, about v0.30+): frees the KV cache while the
   * weights stay on the GPU. It needs a completed pause first (`sleep({ level: 0, mode: 'keep' })`);
   * `wakeUp({ tags: ['kv_cache'] })` brings the cache back and resumes.
   */
  async releaseKvCacheMemory(options?: CallOptions): Promise<void> {
    await this.json(ReleaseKvCacheSchema, { method: 'POST', path: '/release_kv_cache_memory', options, defaultTimeoutMs: LONG_CALL_MS });
  }

  /** A completion (`/v1/completions`). Greedy unless the body says otherwise. */
  async completions(body: { prompt: string; max_tokens?: number; temperature?: number; logprobs?: number; seed?: number; model?: string; [key: string]: unknown }, options?: CallOptions): Promise<CompletionResult> {
    const raw = await this.json(CompletionSchema, {
      method: 'POST',
      path: '/v1/completions',
      auth: 'api',
      body: { temperature: 0, return_tokens_as_token_ids: true, ...body },
      options,
    });
    const choice = raw.choices[0]!;
    const tokens = choice.logprobs?.tokens ?? null;
    const ids = tokens?.every((t) => /^token_id:\d+$/.test(t)) ? tokens.map((t) => Number(t.slice(9))) : null;
    const logprobs = choice.logprobs ? choice.logprobs.token_logprobs.map((x) => x ?? Number.NaN) : null;
    return { text: choice.text, tokenIds: ids, logprobs, raw };
  }

  /** The vsnap plugin's view of the engine (`GET /vsnap/v1/status`). */
  async vsnapStatus(options?: CallOptions): Promise<EngineStatus> {
    return this.json(VsnapStatusSchema, { method: 'GET', path: '/vsnap/v1/status', auth: 'vsnap', idempotent: true, options });
  }

  /**
   * Every worker's weights region table (`GET /vsnap/v1/describe`): what an export sends, without
   * descriptors, also while the engine is asleep. A restore fills new memory for these regions
   * before the wake and hands it over.
   */
  async vsnapDescribe(options?: CallOptions): Promise<EngineRegionTable[]> {
    const r = await this.json(VsnapDescribeSchema, { method: 'GET', path: '/vsnap/v1/describe', auth: 'vsnap', idempotent: true, options, defaultTimeoutMs: LONG_CALL_MS });
    return r.ranks;
  }

  /**
   * Every worker's weights region table with the GPU digests of its regions in chunks of
   * `chunkSize` bytes (`POST /vsnap/v1/digest`, plugins whose status says `digest`), computed in
   * the workers over the memory they have mapped. The weights must be awake.
   */
  async vsnapDigest(args: { chunkSize: number }, options?: CallOptions): Promise<EngineDigestTable[]> {
    const r = await this.json(VsnapDigestSchema, {
      method: 'POST',
      path: '/vsnap/v1/digest',
      auth: 'vsnap',
      body: { chunkSize: args.chunkSize },
      idempotent: true,
      options,
      defaultTimeoutMs: LONG_CALL_MS,
    });
    return r.ranks;
  }

  /**
   * Asks every worker to send its weights regions and descriptors to `socket` (one nonce per
   * rank); with `digestChunkSize`, each region's GPU digests in chunks of that size too, in the
   * same message (plugins whose status says `digest`; an older plugin sends none).
   */
  async vsnapExport(args: { socket: string; nonces: readonly string[]; digestChunkSize?: number }, options?: CallOptions): Promise<Array<{ rank: number; regions: number; bytes: number }>> {
    const r = await this.json(VsnapExportSchema, {
      method: 'POST',
      path: '/vsnap/v1/export',
      auth: 'vsnap',
      body: { socket: args.socket, nonces: [...args.nonces], ...(args.digestChunkSize !== undefined ? { digestChunkSize: args.digestChunkSize } : {}) },
      options,
      defaultTimeoutMs: LONG_CALL_MS,
    });
    return r.ranks;
  }

  /** Sleep through the vsnap routes (no dev mode needed). */
  async vsnapSleep(args: { level: 1 | 2; mode?: 'abort' | 'wait' | 'keep' }, options?: CallOptions): Promise<void> {
    await this.call({ method: 'POST', path: '/vsnap/v1/sleep', auth: 'vsnap', body: args, options, defaultTimeoutMs: LONG_CALL_MS });
  }

  /**
   * Wake through the vsnap routes; no tags wakes everything. With `adopt`, the workers first
   * fetch the weights descriptors offered on that socket (one nonce per rank) and map them back
   * instead of new memory (tier 0).
   */
  async vsnapWake(args: { tags?: readonly string[]; adopt?: { socket: string; nonces: readonly string[] } } = {}, options?: CallOptions): Promise<void> {
    const body = { ...(args.tags ? { tags: [...args.tags] } : {}), ...(args.adopt ? { adopt: { socket: args.adopt.socket, nonces: [...args.adopt.nonces] } } : {}) };
    await this.call({ method: 'POST', path: '/vsnap/v1/wake', auth: 'vsnap', body, options, defaultTimeoutMs: LONG_CALL_MS });
  }

  /**
   * The engine's own weight-resident suspend through the vsnap routes (no dev mode needed): the
   * plugin pauses the engine (level 0) and releases the KV cache through the engine client. vLLM
   * refuses the release while requests are queued: `queued` says what happens to them (default
   * `wait`); after a failure the plugin resumes the engine. Undo with {@link EngineWire.vsnapWake}
   * and tags `['kv_cache']`.
   */
  async vsnapReleaseKvCache(options?: CallOptions, args: { queued?: QueuedRequestsPolicy } = {}): Promise<void> {
    await this.call({ method: 'POST', path: '/vsnap/v1/release_kv_cache', auth: 'vsnap', body: { queued: args.queued ?? 'wait' }, options, defaultTimeoutMs: LONG_CALL_MS });
  }

  /**
   * Has every worker load its weights again from the model's checkpoint, into the weights memory
   * a `vsnapWake` of `['weights']` mapped (vLLM's `collective_rpc("reload_weights")`, the middle
   * step of the documented level-2 wake: docs/features/sleep_mode.md; `Worker.reload_weights` in
   * vllm/v1/worker/gpu_worker.py). The recovery path when no snapshot can be used.
   */
  async vsnapReloadWeights(options?: CallOptions): Promise<void> {
    await this.call({ method: 'POST', path: '/vsnap/v1/reload_weights', auth: 'vsnap', options, defaultTimeoutMs: LONG_CALL_MS });
  }

  /**
   * How this engine can be driven: which mechanism put the vsnap routes on it (see
   * {@link EngineStatus.routes}), or, when they are absent, why none did and whether vLLM's dev
   * routes are there instead.
   */
  async routeMechanism(options?: CallOptions): Promise<{ mechanism: string | null; detail: string; devRoutes: boolean }> {
    try {
      const status = await this.vsnapStatus(options);
      return { ...(status.routes ?? { mechanism: 'unknown', detail: 'an older vsnap plugin (it does not say how its routes were attached)' }), devRoutes: await this.hasDevRoutes(options) };
    } catch (err) {
      if (!(err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && err.details.status === 404)) throw err;
    }
    const devRoutes = await this.hasDevRoutes(options);
    return {
      mechanism: null,
      detail:
        'no /vsnap/v1 routes: the plugin is not loaded or could not attach them (vLLM with endpoint plugins needs VLLM_PLUGINS to name vsnap exactly; ' +
        `older vLLM needs a build_app the plugin can wrap; the engine log says which)${devRoutes ? '; using the dev routes' : `; no dev routes either (VLLM_SERVER_DEV_MODE=1). ${RUST_FRONTEND_HINT}`}`,
      devRoutes,
    };
  }

  private async hasDevRoutes(options?: CallOptions): Promise<boolean> {
    try {
      await this.isSleeping(options);
      return true;
    } catch (err) {
      if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && err.details.status === 404) return false;
      throw err;
    }
  }

  /** Reset the prefix cache through the vsnap routes. */
  async vsnapResetPrefixCache(options?: CallOptions): Promise<void> {
    await this.call({ method: 'POST', path: '/vsnap/v1/reset_prefix_cache', auth: 'vsnap', options });
  }

  /**
   * Forwards a request to the engine as it is (for proxies): the answer's status, headers and
   * body stream come back unread, so streamed completions pass through as they are produced. The
   * client's API key replaces any authorization header on `/v1` paths. Connection failures are
   * `E_ENGINE_UNREACHABLE`; HTTP errors are returned, not thrown.
   */
  async forward(args: { method: string; path: string; headers?: Record<string, string>; body?: string | Buffer; signal?: AbortSignal }): Promise<{
    statusCode: number;
    headers: Record<string, string | string[] | undefined>;
    body: NodeJS.ReadableStream & { destroy(error?: Error): void };
  }> {
    const headers: Record<string, string> = { ...(args.headers ?? {}) };
    delete headers.host;
    delete headers.authorization;
    if (this.options.apiKey && args.path.startsWith('/v1')) headers.authorization = `Bearer ${this.options.apiKey}`;
    try {
      const r = await request(this.baseUrl + args.path, {
        method: args.method as 'GET',
        headers,
        ...(args.body !== undefined ? { body: args.body } : {}),
        dispatcher: this.dispatcher,
        ...(args.signal ? { signal: args.signal } : {}),
      });
      return { statusCode: r.statusCode, headers: r.headers, body: r.body };
    } catch (err) {
      if (args.signal?.aborted) throw abortError(args.signal, `${args.method} ${args.path} on ${this.baseUrl}`);
      throw new VsnapError('E_ENGINE_UNREACHABLE', `cannot reach the engine at ${this.baseUrl} (${args.method} ${args.path}): ${(err as Error).message}`, {
        route: `${args.method} ${args.path}`,
        url: this.baseUrl,
      }, { cause: err });
    }
  }

  /** Frees the wire's connections (when it made its own dispatcher). */
  async close(): Promise<void> {
    if (this.ownsDispatcher) await this.dispatcher.close();
  }

  private async json<S extends z.ZodTypeAny>(schema: S, call: Omit<Call, 'options'> & { options?: CallOptions | undefined }): Promise<z.infer<S>> {
    const text = await this.call(call as Call);
    return this.parse(schema, call, text);
  }

  /** For routes that answer an empty 200 on older versions and JSON on newer ones. */
  private async optionalJson<S extends z.ZodTypeAny>(schema: S, call: Omit<Call, 'options'> & { options?: CallOptions | undefined }): Promise<z.infer<S> | null> {
    const text = await this.call(call as Call);
    return text.trim() === '' ? null : this.parse(schema, call, text);
  }

  private parse<S extends z.ZodTypeAny>(schema: S, call: Omit<Call, 'options'>, text: string): z.infer<S> {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      throw new VsnapError('E_ENGINE_PROTOCOL', `${call.method} ${call.path} on ${this.baseUrl} answered something that is not JSON: ${excerpt(text)}`, {
        route: call.path,
        body: excerpt(text),
      });
    }
    const result = schema.safeParse(value);
    if (!result.success) {
      const issues = result.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`);
      throw new VsnapError(
        'E_ENGINE_PROTOCOL',
        `${call.method} ${call.path} on ${this.baseUrl} answered an unexpected shape (${issues.slice(0, 3).join('; ')}): is this a vLLM engine with a matching vsnap plugin?`,
        { route: call.path, issues, body: excerpt(text) },
      );
    }
    return result.data;
  }

  private async call(call: Call): Promise<string> {
    const attempts = call.idempotent ? (this.options.retries ?? 2) + 1 : 1;
    let lastError: VsnapError | undefined;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        return await this.once(call);
      } catch (err) {
        const e = err as VsnapError;
        const retryable = e.code === 'E_ENGINE_UNREACHABLE' || (e.code === 'E_ENGINE_HTTP' && [502, 503, 504].includes(e.details.status as number));
        if (!retryable || attempt === attempts || call.options?.signal?.aborted) throw e;
        lastError = e;
        await sleep(100 * 2 ** (attempt - 1));
      }
    }
    throw lastError!;
  }

  private async once(call: Call): Promise<string> {
    const url = new URL(this.baseUrl + call.path);
    for (const [k, v] of Object.entries(call.query ?? {})) {
      for (const item of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(item));
    }
    const headers: Record<string, string> = { accept: 'application/json' };
    if (call.body !== undefined) headers['content-type'] = 'application/json';
    const token = call.auth === 'vsnap' ? this.options.token : call.auth === 'api' ? this.options.apiKey : undefined;
    if (token) headers.authorization = `Bearer ${token}`;
    const timeoutMs = call.options?.timeoutMs ?? Math.max(this.options.timeoutMs ?? 30_000, call.defaultTimeoutMs ?? 0);
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = call.options?.signal ? AbortSignal.any([call.options.signal, timeout]) : timeout;
    const route = `${call.method} ${call.path}`;
    let status: number;
    let text: string;
    try {
      const response = await request(url, {
        method: call.method,
        headers,
        ...(call.body !== undefined ? { body: JSON.stringify(call.body) } : {}),
        dispatcher: this.dispatcher,
        signal,
      });
      status = response.statusCode;
      text = await response.body.text();
    } catch (err) {
      if (call.options?.signal?.aborted) throw abortError(call.options.signal, `${route} on ${this.baseUrl}`);
      if (timeout.aborted) {
        throw new VsnapError('E_TIMEOUT', `${route} on ${this.baseUrl} did not answer within ${timeoutMs} ms`, { route, timeoutMs }, { cause: err });
      }
      const code = (err as { code?: string }).code ?? (err instanceof undiciErrors.UndiciError ? err.name : undefined);
      throw new VsnapError(
        'E_ENGINE_UNREACHABLE',
        `cannot reach the engine at ${this.baseUrl} (${route}): ${(err as Error).message}${code ? ` [${code}]` : ''}. Is it running, and is the URL right?`,
        { route, url: this.baseUrl, cause: code },
        { cause: err },
      );
    }
    if (status < 200 || status >= 300) {
      const hint =
        status === 401 ? ' (a missing or wrong token: check EngineClientOptions.token / apiKey)'
        : status === 404 && call.path.startsWith('/vsnap/') ? ' (the vsnap plugin is not loaded: VLLM_PLUGINS=vsnap; with VLLM_USE_RUST_FRONTEND=1 vLLM builds no FastAPI app and no plugin routes can exist)'
        : status === 404 ? ' (start the engine with VLLM_SERVER_DEV_MODE=1 for the dev routes, or use the vsnap routes)'
        : status === 503 && call.path.startsWith('/vsnap/') ? ' (is VSNAP_TOKEN set on the engine?)'
        : '';
      throw new VsnapError('E_ENGINE_HTTP', `${route} on ${this.baseUrl} answered ${status}${hint}: ${excerpt(text)}`, {
        status,
        route,
        body: excerpt(text),
      });
    }
    return text;
  }
}

function excerpt(text: string): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > 300 ? `${flat.slice(0, 300)}…` : flat;
}
