import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { blobDigest } from '../../src/manifest/blob-digest.js';

const sum = (n: number): string => n.toString(16).padStart(32, '0');

function valid(): Record<string, unknown> {
  return {
    schemaVersion: 1,
    id: '0mx26rc38-dff83be0',
    name: 'llama',
    createdAt: '2026-11-29T18:00:00.000Z',
    vsnapVersion: '0.1.0',
    checksumAlgorithm: 'xxh3-128',
    engine: { kind: 'vllm', version: '0.30.1', attentionBackend: 'TRITON_ATTN' },
    model: { id: 'meta/llama', dtype: 'bfloat16', tensorParallelSize: 1 },
    platform: { kind: 'cuda', gpuName: 'NVIDIA H200', computeCapability: '9.0', driverCudaVersion: 13000, vmmGranularity: 2097152 },
    ranks: [
      {
        rank: 0,
        device: { uuid: 'GPU-1', name: 'NVIDIA H200' },
        regions: [
          { key: 'embed.weight', tag: 'weights', size: 8192, chunkSize: 4096, checksums: [sum(1), sum(2)], blob: blobDigest(8192, 4096, [sum(1), sum(2)]), tensors: [{ name: 'embed.weight', offset: 0, dtype: 'bfloat16', shape: [2, 2048] }] },
          { key: 'layers.0.weight', tag: 'weights', size: 4097, chunkSize: 4096, checksums: [sum(3), sum(4)], blob: blobDigest(4097, 4096, [sum(3), sum(4)]) },
          { key: 'anon:0', tag: 'weights', size: 0, chunkSize: 4096, checksums: [], blob: blobDigest(0, 4096, []) },
        ],
      },
    ],
  };
}

function issuesOf(fn: () => unknown): Array<{ path: string; message: string }> {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).code).toBe('E_MANIFEST_INVALID');
    return (err as VsnapError).details.issues as Array<{ path: string; message: string }>;
  }
  throw new Error('expected E_MANIFEST_INVALID');
}

describe('Manifest.parse', () => {
  it('accepts a valid manifest and fills defaults', () => {
    const m = Manifest.parse(valid());
    expect(m.name).toBe('llama');
    expect(m.totalBytes).toBe(8192 + 4097);
    expect(m.regionCount).toBe(3);
    expect(m.data.model?.pipelineParallelSize).toBe(1);
    expect(m.data.engine?.pluginVersion).toBeNull();
    expect(m.data.ranks[0]!.regions[1]!.tensors).toEqual([]);
    expect(m.data.expectedResponse).toBeNull();
    expect(Manifest.parse(JSON.stringify(m.toJSON())).toJSON()).toEqual(m.toJSON());
  });

  it('reports every problem with its path', () => {
    const bad = valid();
    const ranks = bad.ranks as Array<{ regions: Array<Record<string, unknown>> }>;
    ranks[0]!.regions[0]!.size = -1;
    ranks[0]!.regions[1]!.checksums = ['xyz'];
    ranks[0]!.regions[2]!.key = 'embed.weight';
    delete bad.platform;
    const issues = issuesOf(() => Manifest.parse(bad));
    const paths = issues.map((i) => i.path);
    expect(paths).toContain('ranks[0].regions[0].size');
    expect(paths).toContain('ranks[0].regions[1].checksums[0]');
    expect(paths).toContain('ranks[0].regions[2].key');
    expect(paths).toContain('platform');
    expect(issues.find((i) => i.path === 'ranks[0].regions[2].key')!.message).toMatch(/duplicate region key 'embed.weight'/);
  });

  it('checks that the checksum count fits size and chunk size', () => {
    const bad = valid();
    (bad.ranks as Array<{ regions: Array<Record<string, unknown>> }>)[0]!.regions[1]!.checksums = [sum(1)];
    const issues = issuesOf(() => Manifest.parse(bad));
    expect(issues).toEqual([{ path: 'ranks[0].regions[1].checksums', message: '4097 bytes in chunks of 4096 need 2 checksums, found 1' }]);
  });

  it('checks that each blob name is derived from its region (size, chunk size, checksums)', () => {
    const bad = valid();
    const regions = (bad.ranks as Array<{ regions: Array<Record<string, unknown>> }>)[0]!.regions;
    regions[0]!.blob = regions[1]!.blob; // another region's blob
    regions[1]!.checksums = [sum(3), sum(5)]; // checksums changed, blob name kept
    const issues = issuesOf(() => Manifest.parse(bad));
    expect(issues.map((i) => i.path).sort()).toEqual(['ranks[0].regions[0].blob', 'ranks[0].regions[1].blob']);
  });

  it('checks the expected response: logprobs one per token id, no more token ids than maxTokens', () => {
    const response = { prompt: 'hi', maxTokens: 2, tokenIds: [1, 2], text: 'ab', logprobs: [-0.1, -0.2] };
    expect(Manifest.parse({ ...valid(), expectedResponse: response }).data.expectedResponse?.tokenIds).toEqual([1, 2]);
    expect(issuesOf(() => Manifest.parse({ ...valid(), expectedResponse: { ...response, logprobs: [-0.1] } }))).toEqual([
      { path: 'expectedResponse.logprobs', message: '1 logprobs for 2 token ids: one per token expected' },
    ]);
    expect(issuesOf(() => Manifest.parse({ ...valid(), expectedResponse: { ...response, tokenIds: [1, 2, 3], logprobs: null } }))).toEqual([
      { path: 'expectedResponse.tokenIds', message: '3 token ids, more than maxTokens (2)' },
    ]);
  });

  it('the expected response of a prefill check: prompt token ids and one logprob per prompt token after the first, both or neither', () => {
    const response = { prompt: 'hi', maxTokens: 1, tokenIds: [7], text: 'x', logprobs: [-0.5], promptTokenIds: [104, 105], promptLogprobs: [-1.25] };
    expect(Manifest.parse({ ...valid(), expectedResponse: response }).data.expectedResponse).toMatchObject({ promptTokenIds: [104, 105], promptLogprobs: [-1.25] });
    // an older manifest (a decode check) has neither, and stays so
    const { promptTokenIds: _ids, promptLogprobs: _lps, ...older } = response;
    const parsed = Manifest.parse({ ...valid(), expectedResponse: older }).data.expectedResponse!;
    expect('promptLogprobs' in parsed || 'promptTokenIds' in parsed).toBe(false);
    expect(issuesOf(() => Manifest.parse({ ...valid(), expectedResponse: { ...response, promptLogprobs: [-1, -2] } }))).toEqual([
      { path: 'expectedResponse.promptLogprobs', message: '2 prompt logprobs for 2 prompt tokens: one per token after the first expected' },
    ]);
    expect(issuesOf(() => Manifest.parse({ ...valid(), expectedResponse: { ...older, promptLogprobs: [-1] } }))).toEqual([
      { path: 'expectedResponse.promptLogprobs', message: 'promptTokenIds and promptLogprobs come together (a prefill check) or not at all' },
    ]);
  });

  it('checks sizes: tensors inside their region', () => {
    const bad = valid();
    const regions = (bad.ranks as Array<{ regions: Array<Record<string, unknown>> }>)[0]!.regions;
    (regions[0]!.tensors as Array<Record<string, unknown>>)[0]!.offset = 8193;
    expect(issuesOf(() => Manifest.parse(bad)).map((i) => i.path)).toEqual(['ranks[0].regions[0].tensors[0].offset']);
    // (a total beyond 2^53 is refused too, but needs over 8 million checksums to build: not run here)
  });

  it('refuses newer schema versions with an upgrade hint, and non-JSON', () => {
    expect(() => Manifest.parse({ ...valid(), schemaVersion: 3 })).toThrow(/schema version 3.*Upgrade vsnap/);
    expect(issuesOf(() => Manifest.parse('{not json'))).toEqual([{ path: '(root)', message: 'not JSON' }]);
  });
});

describe('Manifest compatibility', () => {
  const m = Manifest.parse(valid());
  const liveRegions = [
    { key: 'anon:0', size: 0 },
    { key: 'layers.0.weight', size: 4097, tag: 'weights' },
    { key: 'embed.weight', size: 8192 },
  ];

  it('matches regions by key, in any order', () => {
    expect(m.checkCompatibility({ ranks: [{ regions: liveRegions }] })).toEqual([]);
    expect(() => m.assertCompatible({ ranks: [{ regions: [...liveRegions].reverse() }] })).not.toThrow();
  });

  it('lists every difference in one E_MANIFEST_MISMATCH', () => {
    const live = {
      model: { id: 'other/model', dtype: 'bfloat16' },
      engine: { version: '0.31.0' },
      platform: { computeCapability: '9.0' },
      ranks: [
        {
          regions: [
            { key: 'embed.weight', size: 16384 },
            { key: 'layers.0.weight', size: 4097, tag: 'kv_cache' },
            { key: 'layers.9.weight', size: 4096 },
            { key: 'layers.9.weight', size: 4096 },
          ],
        },
      ],
    };
    let error: VsnapError | undefined;
    try {
      m.assertCompatible(live);
    } catch (err) {
      error = err as VsnapError;
    }
    expect(error?.code).toBe('E_MANIFEST_MISMATCH');
    const mismatches = error!.details.mismatches as Array<{ kind: string; path: string }>;
    expect(mismatches.map((x) => `${x.kind} ${x.path}`).sort()).toEqual(
      [
        'field engine.version',
        'field model.id',
        'region-duplicate ranks[0].regions["layers.9.weight"]',
        'region-missing ranks[0].regions["anon:0"]',
        'region-size ranks[0].regions["embed.weight"].size',
        'region-tag ranks[0].regions["layers.0.weight"].tag',
        'region-unexpected ranks[0].regions["layers.9.weight"]',
      ].sort(),
    );
    expect(error!.message).toMatch(/7 differences/);
    expect(error!.message).toMatch(/model\.id: the snapshot has "meta\/llama", the live engine "other\/model"/);
  });

  it('reports a rank count difference', () => {
    const diff = m.checkCompatibility({ ranks: [{ regions: liveRegions }, { regions: [] }] });
    expect(diff).toHaveLength(1);
    expect(diff[0]!.kind).toBe('rank-count');
  });
});
