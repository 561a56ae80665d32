/**
 * The public shape of a manifest (schema version 2; version-1 manifests are read as version 2
 * without GPU digests). schema.ts validates it; a compile-time
 * check there keeps the two identical.
 */

/**
 * A tensor inside a region, as the engine described it.
 * @public
 */
export interface TensorInfo {
  /** The parameter or buffer name, e.g. `model.layers.0.mlp.down_proj.weight`. */
  readonly name: string;
  /** Byte offset inside the region. */
  readonly offset: number;
  /** The engine's dtype name, e.g. `bfloat16`. */
  readonly dtype: string;
  /** Dimensions, outermost first. */
  readonly shape: readonly number[];
}

/**
 * One captured memory region.
 * @public
 */
export interface RegionInfo {
  /** Order-independent identity: the lowest-offset named tensor inside, else `anon:N`. */
  readonly key: string;
  /** The allocator tag, e.g. `weights`. */
  readonly tag: string;
  /** Bytes captured. */
  readonly size: number;
  /** Bytes per checksum (a multiple of 4096). */
  readonly chunkSize: number;
  /** xxh3-128 of each chunk, 32 lowercase hex digits, in order. */
  readonly checksums: readonly string[];
  /** The content digest naming the region's blob in the store. */
  readonly blob: string;
  /** The tensors inside, when the engine described them. */
  readonly tensors: readonly TensorInfo[];
  /** The GPU digest (`vsnap-gd1`) of each chunk, in order; null for a version-1 capture. */
  readonly digests: readonly string[] | null;
  /** How the blob's chunks are coded; absent when the blob holds the raw bytes. Checksums and digests are of the decoded bytes. */
  readonly codec?: RegionCodec | undefined;
}

/**
 * The coding of a region's blob (docs/compression.md).
 * @public
 */
export interface RegionCodec {
  /** The chunk codec. */
  readonly name: 'vsnap-c1';
  /** Each chunk's size in the blob, coded (its 64-byte header included), in order. */
  readonly codedSizes: readonly number[];
}

/**
 * The regions of one rank (one GPU of the engine).
 * @public
 */
export interface RankInfo {
  /** 0-based, equal to the position in `ranks`. */
  readonly rank: number;
  /** The GPU the regions were captured from (null for host memory). */
  readonly device: { readonly uuid: string; readonly name: string } | null;
  /** The rank's regions, in capture order. */
  readonly regions: readonly RegionInfo[];
}

/**
 * The engine a snapshot was taken from.
 * @public
 */
export interface EngineInfo {
  /** e.g. `vllm`. */
  readonly kind: string;
  /** The engine's own version string. */
  readonly version: string;
  /** The vsnap engine plugin's version. */
  readonly pluginVersion: string | null;
  /** e.g. `TRITON_ATTN`. */
  readonly attentionBackend: string | null;
}

/**
 * The model a snapshot holds.
 * @public
 */
export interface ModelInfo {
  /** e.g. a Hugging Face repo id. */
  readonly id: string;
  /** The exact revision (commit) of the checkpoint. */
  readonly revision: string | null;
  /** The weights' dtype as the engine names it, e.g. `bfloat16`. */
  readonly dtype: string | null;
  /** e.g. `fp8`, `nvfp4`, `awq`; null when unquantised. */
  readonly quantization: string | null;
  /** Tensor-parallel degree (GPUs a layer is split over). */
  readonly tensorParallelSize: number;
  /** Pipeline-parallel degree (stages). */
  readonly pipelineParallelSize: number;
}

/**
 * The hardware and driver a snapshot was taken on.
 * @public
 */
export interface PlatformInfo {
  /** `cuda` for GPU memory, `host` for host memory regions. */
  readonly kind: 'cuda' | 'host';
  /** The GPU's name as the driver reports it, e.g. `NVIDIA H200`. */
  readonly gpuName: string | null;
  /** "major.minor". */
  readonly computeCapability: string | null;
  /** The CUDA version the driver supports (cuDriverGetVersion, e.g. 13000). */
  readonly driverCudaVersion: number | null;
  /** The VMM allocation granularity of the GPU. */
  readonly vmmGranularity: number | null;
}

/**
 * The engine's answer to the check recorded at capture and compared after every restore: a short
 * greedy completion and, for a prefill check, the prompt's log-probabilities (see
 * ResponseCheckOptions).
 * @public
 */
export interface ExpectedResponse {
  /** The prompt sent. */
  readonly prompt: string;
  /** Tokens generated (greedy, temperature 0). */
  readonly maxTokens: number;
  /** Prefill check: the prompt's token ids (empty where the engine gave no ids). Absent for a decode check and in older manifests. */
  readonly promptTokenIds?: readonly number[] | undefined;
  /** Prefill check: the log-probability of each prompt token after the first. Its presence makes the check after a restore a prefill check. */
  readonly promptLogprobs?: readonly number[] | undefined;
  /** The generated token ids. */
  readonly tokenIds: readonly number[];
  /** The generated text. */
  readonly text: string;
  /** Per-token logprobs, where the engine gives them. */
  readonly logprobs: readonly number[] | null;
}

/**
 * The JSON form of a manifest, schema version 2.
 * @public
 */
export interface ManifestData {
  /** 2 (version-1 manifests are migrated when read). */
  readonly schemaVersion: 2;
  /** Unique in the store, sortable by creation time. */
  readonly id: string;
  /** The snapshot's name. */
  readonly name: string;
  /** ISO 8601. */
  readonly createdAt: string;
  /** The vsnap version that wrote it. */
  readonly vsnapVersion: string;
  /** The chunk checksum algorithm. */
  readonly checksumAlgorithm: 'xxh3-128';
  /** The GPU digest algorithm of `digests` in the regions; null for a version-1 capture. */
  readonly digestAlgorithm: 'vsnap-gd1' | null;
  /** The engine captured from (null for plain region captures). */
  readonly engine: EngineInfo | null;
  /** The model held (null for plain region captures). */
  readonly model: ModelInfo | null;
  /** Where it was captured. */
  readonly platform: PlatformInfo;
  /** One per rank, in rank order. */
  readonly ranks: readonly RankInfo[];
  /** A short greedy completion taken at capture, re-run after every restore. */
  readonly expectedResponse: ExpectedResponse | null;
  /** Free-form labels. */
  readonly labels: Readonly<Record<string, string>>;
}
