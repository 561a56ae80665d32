import { z } from 'zod';

/** Shapes of vLLM's answers (old and new forms) and of the vsnap routes. @internal */

export const VersionSchema = z.object({ version: z.string() });

export const ModelListSchema = z.object({
  object: z.literal('list'),
  data: z.array(z.object({ id: z.string(), object: z.string().optional(), owned_by: z.string().optional(), root: z.string().nullish(), max_model_len: z.number().nullish() }).passthrough()),
});

export const IsSleepingSchema = z.object({ is_sleeping: z.boolean() });

/** Newer vLLM answers sleep/wake with JSON; older with an empty 200. Both are accepted. */
export const SleepAnswerSchema = z.object({ status: z.string(), level: z.number().optional() }).passthrough();
export const WakeAnswerSchema = z.object({ status: z.string(), tags_woken: z.array(z.string()).nullish() }).passthrough();

export const CollectiveRpcSchema = z.object({ results: z.array(z.unknown()) });

export const CompletionSchema = z.object({
  id: z.string(),
  model: z.string(),
  choices: z
    .array(
      z
        .object({
          index: z.number(),
          text: z.string(),
          finish_reason: z.string().nullish(),
          logprobs: z
            .object({ tokens: z.array(z.string()), token_logprobs: z.array(z.number().nullable()) })
            .passthrough()
            .nullish(),
        })
        .passthrough(),
    )
    .min(1),
  usage: z.object({ prompt_tokens: z.number(), completion_tokens: z.number() }).passthrough().optional(),
});

const RankStatusSchema = z
  .object({
    rank: z.number().int().nonnegative(),
    pid: z.number().int(),
    device: z.object({ ordinal: z.number().int(), uuid: z.string() }),
    memory: z.enum(['cuda', 'host']),
    sleepMode: z.boolean(),
    hooks: z.string().nullable(),
    weightsMapped: z.boolean(),
    regions: z.number().int(),
    bytes: z.number(),
    attentionBackend: z.string().nullable(),
    // Newer plugins: whether the bridge works in this worker (a hook that failed disables it, never the engine),
    // how many weights allocations were of each kind at load, and the other memory tags.
    supported: z.boolean().optional(),
    unsupportedReason: z.string().nullable().optional(),
    weightsMemory: z.record(z.string(), z.number()).optional(),
    otherTags: z.array(z.string()).optional(),
    // Newer plugins: whether the worker has vLLM's reload_weights (the recovery path).
    reloadWeights: z.boolean().optional(),
    // Newer plugins: the process's GPU memory outside its weights (NVML), for the room check of a move to another GPU.
    processBytes: z.number().int().nonnegative().nullable().optional(),
    processBytesSource: z.enum(['nvml', 'last']).nullable().optional(),
    // Newer plugins: the sleep-mode allocator's presence (--enable-cumem-allocator puts it there without
    // sleep mode), the allocator tags with memory asleep (null: the allocator does not say), the frontend.
    cumemAllocator: z.boolean().optional(),
    asleepTags: z.array(z.string()).nullable().optional(),
    frontend: z.string().optional(),
    // Newer plugins: the region table can be read while asleep (vsnap_describe).
    describe: z.boolean().optional(),
    // Newer plugins: the worker digests its own weights (vsnap_digest), the dirty check without an export.
    digest: z.boolean().optional(),
  })
  .passthrough();

export const RoutesSchema = z.object({ mechanism: z.string().nullable(), detail: z.string() });

export const VsnapStatusSchema = z.object({
  engine: z.object({ kind: z.string(), version: z.string(), pluginVersion: z.string().nullable(), attentionBackend: z.string().nullable() }),
  model: z.object({
    id: z.string(),
    revision: z.string().nullable(),
    dtype: z.string().nullable(),
    quantization: z.string().nullable(),
    tensorParallelSize: z.number().int().positive(),
    pipelineParallelSize: z.number().int().positive(),
  }),
  sleeping: z.boolean(),
  routes: RoutesSchema.optional(),
  features: z.object({ releaseKvCache: z.boolean() }).passthrough().optional(),
  ranks: z.array(RankStatusSchema).min(1),
});

export const ReleaseKvCacheSchema = z.object({ status: z.string() }).passthrough();
export const ResetPrefixCacheSchema = z.object({ success: z.boolean() }).passthrough();

export const VsnapExportSchema = z.object({ ranks: z.array(z.object({ rank: z.number(), regions: z.number(), bytes: z.number() }).passthrough()) });

/** What each worker sends over the socket with its descriptors. */
export const ExportHeaderSchema = z.object({
  version: z.literal(1),
  rank: z.number().int().nonnegative(),
  pid: z.number().int(),
  memory: z.enum(['cuda', 'host']),
  device: z.object({ ordinal: z.number().int(), uuid: z.string() }),
  regions: z.array(
    z.object({
      key: z.string().min(1),
      tag: z.string().min(1),
      va: z.number().int().nonnegative(),
      size: z.number().int().positive(),
      tensors: z.array(z.object({ name: z.string(), offset: z.number().int().nonnegative(), dtype: z.string(), shape: z.array(z.number().int().nonnegative()) })),
      // A describe's: whether vLLM's own wake writes into the region (the model's buffers copied back after a level-2 sleep).
      wakeWrites: z.boolean().optional(),
      // An export asked for digests (digestChunkSize): the region's GPU digests, in chunks of the header's chunkSize.
      digests: z.array(z.string().regex(/^[0-9a-f]{32}$/)).optional(),
    }),
  ),
  // An export asked for digests: the chunk size they were taken in.
  chunkSize: z.number().int().positive().optional(),
});

/** `GET /vsnap/v1/describe` (and the workers' `vsnap_describe`): every rank's region table, as an export's header. */
export const VsnapDescribeSchema = z.object({ ranks: z.array(ExportHeaderSchema).min(1) });

const DIGEST_HEX = z.string().regex(/^[0-9a-f]{32}$/);

/** `POST /vsnap/v1/digest` (and the workers' `vsnap_digest`): every rank's region table, each region with its GPU digests. */
export const VsnapDigestSchema = z.object({
  ranks: z
    .array(
      ExportHeaderSchema.extend({
        chunkSize: z.number().int().positive(),
        regions: z.array(ExportHeaderSchema.shape.regions.element.extend({ digests: z.array(DIGEST_HEX) })),
      }),
    )
    .min(1),
});

/** vLLM's Rust frontend builds no FastAPI app: neither the plugin's routes nor the dev routes exist. @internal */
export const RUST_FRONTEND_HINT =
  "If the engine runs vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1), no endpoint plugin can attach and no dev route is served: start it without VLLM_USE_RUST_FRONTEND (or =0), with VLLM_PLUGINS=vsnap.";
