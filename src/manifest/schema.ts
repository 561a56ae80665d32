import { z } from 'zod';

import { blobDigest, codedBlobDigest } from './blob-digest.js';
import type { ManifestData } from './types.js';

/** Sizes and offsets are JSON numbers: exact up to 2^53 bytes (8 PiB). */
const byteCount = z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER);
const checksum = z.string().regex(/^[0-9a-f]{32}$/, 'a 32-digit lowercase hex xxh3-128 checksum');
const digest = z.string().regex(/^[0-9a-f]{64}$/, 'a 64-digit lowercase hex sha256 digest');
const gpuDigest = z.string().regex(/^[0-9a-f]{32}$/, 'a 32-digit lowercase hex vsnap-gd1 digest');

export const TensorSchema = z.object({
  name: z.string().min(1),
  offset: byteCount,
  dtype: z.string().min(1),
  shape: z.array(z.number().int().nonnegative()),
});

/** The 64-byte header of a vsnap-c1 chunk (native/codec/codec_format.h): a coded chunk is never smaller. */
const CODED_HEADER_BYTES = 64;

export const RegionCodecSchema = z.object({
  /** The chunk codec (docs/compression.md). */
  name: z.literal('vsnap-c1'),
  /** Each chunk's size in the blob, coded (header included), in order. */
  codedSizes: z.array(byteCount),
});

export const RegionSchema = z
  .object({
    /** Order-independent identity: the lowest-offset named tensor inside, else `anon:N`. */
    key: z.string().min(1).max(1024),
    /** The allocator tag, e.g. `weights`. */
    tag: z.string().min(1).max(64),
    size: byteCount,
    chunkSize: z.number().int().positive().multipleOf(4096).max(1 << 30),
    checksums: z.array(checksum),
    /** The content digest naming the blob in the store. */
    blob: digest,
    tensors: z.array(TensorSchema).default([]),
    /** Schema 2: the GPU digest of each chunk (null in migrated version-1 manifests). */
    digests: z.array(gpuDigest).nullable().default(null),
    /** Absent: the blob holds the raw bytes (every manifest before the codec). */
    codec: RegionCodecSchema.optional(),
  })
  .superRefine((region, ctx) => {
    const expected = Math.ceil(region.size / region.chunkSize);
    if (region.digests && region.digests.length !== expected) {
      ctx.addIssue({ code: 'custom', path: ['digests'], message: `${expected} chunks need ${expected} digests, found ${region.digests.length}` });
    }
    if (region.checksums.length !== expected) {
      ctx.addIssue({
        code: 'custom',
        path: ['checksums'],
        message: `${region.size} bytes in chunks of ${region.chunkSize} need ${expected} checksums, found ${region.checksums.length}`,
      });
    } else if (region.codec) {
      const codedSizes = region.codec.codedSizes;
      if (codedSizes.length !== expected) {
        ctx.addIssue({ code: 'custom', path: ['codec', 'codedSizes'], message: `${expected} chunks need ${expected} coded sizes, found ${codedSizes.length}` });
      } else {
        codedSizes.forEach((coded, i) => {
          const raw = Math.min(region.chunkSize, region.size - i * region.chunkSize);
          if (coded < CODED_HEADER_BYTES || coded > raw + CODED_HEADER_BYTES) {
            ctx.addIssue({ code: 'custom', path: ['codec', 'codedSizes', i], message: `a coded chunk of ${raw} bytes takes ${CODED_HEADER_BYTES} to ${raw + CODED_HEADER_BYTES} bytes, not ${coded}` });
          }
        });
        if (codedBlobDigest(region.size, region.chunkSize, region.checksums, region.codec.name, codedSizes) !== region.blob) {
          ctx.addIssue({ code: 'custom', path: ['blob'], message: "the blob name is not the digest of the region's checksums and coded sizes" });
        }
      }
    } else if (blobDigest(region.size, region.chunkSize, region.checksums) !== region.blob) {
      // The blob's name is derived from the region's size, chunk size and checksums: a manifest
      // naming another blob would restore bytes it cannot vouch for.
      ctx.addIssue({ code: 'custom', path: ['blob'], message: 'the blob name is not the digest of the region\'s size, chunk size and checksums' });
    }
    region.tensors.forEach((t, i) => {
      if (t.offset > region.size) {
        ctx.addIssue({ code: 'custom', path: ['tensors', i, 'offset'], message: `offset ${t.offset} lies beyond the region's ${region.size} bytes` });
      }
    });
  });

export const RankSchema = z
  .object({
    rank: z.number().int().nonnegative(),
    /** The GPU the rank's regions were captured from (null for host memory). */
    device: z.object({ uuid: z.string(), name: z.string() }).nullable(),
    regions: z.array(RegionSchema),
  })
  .superRefine((rank, ctx) => {
    const seen = new Set<string>();
    rank.regions.forEach((r, i) => {
      if (seen.has(r.key)) ctx.addIssue({ code: 'custom', path: ['regions', i, 'key'], message: `duplicate region key '${r.key}'` });
      seen.add(r.key);
    });
  });

export const EngineSchema = z.object({
  kind: z.string().min(1),
  version: z.string().min(1),
  pluginVersion: z.string().nullable().default(null),
  attentionBackend: z.string().nullable().default(null),
});

export const ModelSchema = z.object({
  id: z.string().min(1),
  revision: z.string().nullable().default(null),
  dtype: z.string().nullable().default(null),
  quantization: z.string().nullable().default(null),
  tensorParallelSize: z.number().int().positive().default(1),
  pipelineParallelSize: z.number().int().positive().default(1),
});

export const PlatformSchema = z.object({
  /** `cuda` for GPU memory, `host` for host memory regions. */
  kind: z.enum(['cuda', 'host']),
  gpuName: z.string().nullable().default(null),
  computeCapability: z.string().nullable().default(null),
  /** The CUDA version the driver supports (cuDriverGetVersion, e.g. 13000). */
  driverCudaVersion: z.number().int().nonnegative().nullable().default(null),
  vmmGranularity: z.number().int().positive().nullable().default(null),
});

export const ExpectedResponseSchema = z
  .object({
    prompt: z.string(),
    maxTokens: z.number().int().positive(),
    tokenIds: z.array(z.number().int().nonnegative()),
    text: z.string(),
    logprobs: z.array(z.number()).nullable().default(null),
    /** Prefill check only (absent in older manifests and decode checks): the prompt as token ids. */
    promptTokenIds: z.array(z.number().int().nonnegative()).optional(),
    /** Prefill check only: the log-probability of each prompt token after the first. */
    promptLogprobs: z.array(z.number()).optional(),
  })
  .superRefine((r, ctx) => {
    if ((r.promptTokenIds === undefined) !== (r.promptLogprobs === undefined)) {
      ctx.addIssue({ code: 'custom', path: ['promptLogprobs'], message: 'promptTokenIds and promptLogprobs come together (a prefill check) or not at all' });
    }
    if (r.promptTokenIds?.length && r.promptLogprobs && r.promptLogprobs.length !== r.promptTokenIds.length - 1) {
      ctx.addIssue({ code: 'custom', path: ['promptLogprobs'], message: `${r.promptLogprobs.length} prompt logprobs for ${r.promptTokenIds.length} prompt tokens: one per token after the first expected` });
    }
    if (r.tokenIds.length > r.maxTokens) {
      ctx.addIssue({ code: 'custom', path: ['tokenIds'], message: `${r.tokenIds.length} token ids, more than maxTokens (${r.maxTokens})` });
    }
    if (r.logprobs !== null && r.logprobs.length !== r.tokenIds.length) {
      ctx.addIssue({ code: 'custom', path: ['logprobs'], message: `${r.logprobs.length} logprobs for ${r.tokenIds.length} token ids: one per token expected` });
    }
  });

export const ManifestSchema = z
  .object({
    /** Version 1 (no GPU digests) is migrated to 2 on read. */
    schemaVersion: z.union([z.literal(1), z.literal(2)]).transform(() => 2 as const),
    id: z.string().regex(/^[0-9a-z-]{8,64}$/, 'a snapshot id (lowercase letters, digits, dashes)'),
    name: z.string().min(1),
    createdAt: z.iso.datetime(),
    vsnapVersion: z.string().min(1),
    checksumAlgorithm: z.literal('xxh3-128'),
    digestAlgorithm: z.literal('vsnap-gd1').nullable().default(null),
    engine: EngineSchema.nullable().default(null),
    model: ModelSchema.nullable().default(null),
    platform: PlatformSchema,
    ranks: z.array(RankSchema).min(1),
    /** A short greedy completion taken at capture, re-run after every restore. */
    expectedResponse: ExpectedResponseSchema.nullable().default(null),
    labels: z.record(z.string(), z.string()).default({}),
  })
  .superRefine((m, ctx) => {
    m.ranks.forEach((r, i) => {
      if (r.rank !== i) ctx.addIssue({ code: 'custom', path: ['ranks', i, 'rank'], message: `ranks must be listed in order: expected ${i}` });
    });
    // Manifest.totalBytes must be exact: the sum of every region's size stays a safe integer.
    let total = 0;
    for (const rank of m.ranks) for (const region of rank.regions) total += region.size;
    if (!Number.isSafeInteger(total)) {
      ctx.addIssue({ code: 'custom', path: ['ranks'], message: `the regions total ${total} bytes, beyond 2^53 - 1: sizes cannot be exact` });
    }
  });

// The schemas must produce exactly the public interfaces of types.ts (checked at compile time).
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type DeepReadonly<T> = T extends (infer E)[] ? ReadonlyArray<DeepReadonly<E>> : T extends object ? { readonly [K in keyof T]: DeepReadonly<T[K]> } : T;
const schemaMatchesTypes: Same<DeepReadonly<z.infer<typeof ManifestSchema>>, ManifestData> = true;
void schemaMatchesTypes;
