// The engine client's public types: its options, one call's options, the plugin's status, a completion.
import type { Dispatcher } from 'undici';

import type { EngineInfo, ModelInfo, TensorInfo } from '../manifest/types.js';

/**
 * Options of {@link EngineClient}.
 * @public
 */
export interface EngineClientOptions {
  /** The engine's base URL, e.g. `http://127.0.0.1:8000`. */
  readonly baseUrl: string;
  /** The bearer token of the vsnap routes (the engine's `VSNAP_TOKEN`). */
  readonly token?: string;
  /** vLLM's `--api-key`, sent on `/v1` routes. */
  readonly apiKey?: string;
  /** Per-call timeout (default 30 s; sleep, wake and export get 10 minutes). */
  readonly timeoutMs?: number;
  /** Retries of idempotent calls (GETs) on connection errors and 502/503/504 (default 2). */
  readonly retries?: number;
  /** An undici dispatcher to use (default: a keep-alive Agent owned by the client). */
  readonly dispatcher?: Dispatcher;
}

/**
 * Options of one call.
 * @public
 */
export interface CallOptions {
  /** Cancels the call (rejects with E_ABORTED). */
  readonly signal?: AbortSignal;
  /** Overrides the client's timeout for this call. */
  readonly timeoutMs?: number;
}

/**
 * An engine's state as its vsnap plugin reports it (`GET /vsnap/v1/status`).
 * @public
 */
export interface EngineStatus {
  /** Engine kind, version, plugin version and attention backend. */
  readonly engine: EngineInfo;
  /** The model served. */
  readonly model: ModelInfo;
  /** True while any memory tag is asleep (or, newer vLLM, while the scheduler is paused). */
  readonly sleeping: boolean;
  /**
   * How the plugin's routes got onto the engine's app: `endpoint_plugins` (vLLM's
   * `vllm.endpoint_plugins` entry point), `build_app wrap` (older vLLM), or null with the reason
   * when they could not be attached (the flows then use the dev routes). Absent from older plugins.
   */
  readonly routes?: { readonly mechanism: string | null; readonly detail: string };
  /** Engine features the plugin found: `releaseKvCache`, the engine's own weight-resident suspend. */
  readonly features?: { readonly releaseKvCache: boolean };
  /** One entry per worker (GPU). */
  readonly ranks: ReadonlyArray<{
    readonly rank: number;
    readonly pid: number;
    readonly device: { readonly ordinal: number; readonly uuid: string };
    /** `cuda`, or `host` for the CPU test engine. */
    readonly memory: 'cuda' | 'host';
    readonly sleepMode: boolean;
    readonly weightsMapped: boolean;
    readonly regions: number;
    readonly bytes: number;
    readonly attentionBackend: string | null;
    /** False when a bridge hook failed in this worker: the engine runs on without vsnap (reason below). */
    readonly supported?: boolean;
    /** Why the bridge stepped aside, when it did. */
    readonly unsupportedReason?: string | null;
    /**
     * Weights allocations per kind of memory at load: `posix-fd` (exported as it is), `none` or
     * `fabric` (rehomed into POSIX-FD memory at load).
     */
    readonly weightsMemory?: Readonly<Record<string, number>>;
    /** The allocator's other tags (`kv_cache`, `cudagraph`, ...): never exported as weights. */
    readonly otherTags?: readonly string[];
    /** Whether the worker has vLLM's `reload_weights` (the recovery path). Absent from older plugins. */
    readonly reloadWeights?: boolean;
    /**
     * The worker process's GPU memory outside the weights it owns, in bytes, as NVML accounts it
     * (after a level-2 sleep: the CUDA context, graph pool and leftovers a process restore
     * recreates); null where NVML cannot say (host memory, no libnvidia-ml, a PID namespace).
     * Absent from older plugins.
     */
    readonly processBytes?: number | null;
    /** `nvml`: read at this status; `last`: remembered from an earlier one (a checkpointed process is not listed). */
    readonly processBytesSource?: 'nvml' | 'last' | null;
    /**
     * Whether the sleep-mode allocator holds the weights (also without sleep mode, with vLLM's
     * `--enable-cumem-allocator`); `sleepMode` says whether sleep mode is on. Absent from older plugins.
     */
    readonly cumemAllocator?: boolean;
    /** The allocator's tags with memory asleep; null where the allocator does not say. Absent from older plugins. */
    readonly asleepTags?: readonly string[] | null;
    /** `python` (vLLM's FastAPI server) or `rust` (`VLLM_USE_RUST_FRONTEND=1`: no vsnap routes). Absent from older plugins. */
    readonly frontend?: string;
    /** Whether the plugin describes the weights regions while asleep ({@link EngineClient.describe}). Absent from older plugins. */
    readonly describe?: boolean;
    /** Whether the worker digests its own weights (/vsnap/v1/digest). Absent from older plugins. */
    readonly digest?: boolean;
  }>;
}

/**
 * One worker's weights region table ({@link EngineClient.describe}): each region's key (the
 * lowest-offset named tensor in it, else `anon:N`), allocator tag, address in the worker, size and
 * tensors.
 * @public
 */
export interface EngineRegionTable {
  /** The table's format (1). */
  readonly version: 1;
  /** The worker's rank. */
  readonly rank: number;
  /** The worker's process id. */
  readonly pid: number;
  /** `cuda`, or `host` for the CPU test engine. */
  readonly memory: 'cuda' | 'host';
  /** The worker's GPU: its ordinal in the worker, and its UUID. */
  readonly device: { readonly ordinal: number; readonly uuid: string };
  /** The weights regions, in address order. */
  readonly regions: ReadonlyArray<{
    readonly key: string;
    readonly tag: string;
    readonly va: number;
    readonly size: number;
    readonly tensors: readonly TensorInfo[];
    /** Whether the engine's own wake writes into the region (vLLM copies the model's buffers back after a level-2 sleep). */
    readonly wakeWrites?: boolean;
  }>;
}

/**
 * One worker's weights region table with the GPU digests of each region, computed by the worker
 * over the memory it has mapped (`POST /vsnap/v1/digest`): what a suspend's dirty check compares
 * with the snapshot, without exporting the weights.
 * @public
 */
export interface EngineDigestTable extends Omit<EngineRegionTable, 'regions'> {
  /** The bytes each digest covers (a region's last chunk may be shorter). */
  readonly chunkSize: number;
  /** The weights regions, in address order, each with its digests (vsnap-gd1, 32 hex digits a chunk). */
  readonly regions: ReadonlyArray<EngineRegionTable['regions'][number] & { readonly digests: readonly string[] }>;
}

/**
 * What the engine's own weight-resident suspend does with requests it still has: `wait` lets them
 * finish first (queued ones are served, the release tried again), `abort` aborts them.
 * @public
 */
export type QueuedRequestsPolicy = 'wait' | 'abort';

/**
 * A completion, reduced to what vsnap compares.
 * @public
 */
export interface CompletionResult {
  /** The generated text. */
  readonly text: string;
  /** Generated token ids (asked for with `return_tokens_as_token_ids`), when the engine gives them. */
  readonly tokenIds: number[] | null;
  /** Per-token logprobs, when asked for. */
  readonly logprobs: number[] | null;
  /** The engine's whole answer. */
  readonly raw: unknown;
}


/**
 * What the response check needs of a client: its URL and its completions (the client's own, so a
 * test's client may see them fail). The flows' view; not exported from the package.
 */
export interface Completer {
  readonly baseUrl: string;
  completions(body: { prompt: string; max_tokens?: number; temperature?: number; logprobs?: number; [key: string]: unknown }, options?: CallOptions): Promise<CompletionResult>;
}
