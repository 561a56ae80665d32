import { describe, expect, it } from 'vitest';

import type { EngineStatus } from '../../src/engine/engine-client.js';
import { VsnapError, type ErrorCode } from '../../src/errors.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { expectedFor, recoveryReason } from '../../src/flows/recovery.js';

// Which restore errors recovery goes past (restoreEngine's recovery: 'reload'), as a pure decision.

function manifest(model: Record<string, unknown>, expected = true): Manifest {
  return Manifest.parse({
    schemaVersion: 1,
    id: '0mx26rc38-dff83be0',
    name: 'm',
    createdAt: '2026-11-29T18:00:00.000Z',
    vsnapVersion: '0.1.0',
    checksumAlgorithm: 'xxh3-128',
    engine: { kind: 'vllm', version: '0.30.1' },
    model: { id: 'org/m', revision: 'r1', dtype: 'bfloat16', tensorParallelSize: 1, ...model },
    platform: { kind: 'host' },
    ...(expected ? { expectedResponse: { prompt: 'p', maxTokens: 2, tokenIds: [1, 2], text: 'ab', logprobs: null } } : {}),
    ranks: [{ rank: 0, device: { uuid: 'host', name: 'host' }, regions: [] }],
  });
}

function status(model: Partial<EngineStatus['model']> = {}, reloadWeights?: boolean): EngineStatus {
  return {
    engine: { kind: 'vllm', version: '0.31.0', pluginVersion: null, attentionBackend: null },
    model: { id: 'org/m', revision: 'r1', dtype: 'bfloat16', quantization: null, tensorParallelSize: 1, pipelineParallelSize: 1, ...model },
    sleeping: true,
    ranks: [{ rank: 0, pid: 1, device: { ordinal: 0, uuid: 'u' }, memory: 'host', sleepMode: true, weightsMapped: false, regions: 1, ...(reloadWeights !== undefined ? { reloadWeights } : {}) }],
  } as unknown as EngineStatus;
}

const err = (code: ErrorCode) => new VsnapError(code, 'x');

describe('recoveryReason', () => {
  it('goes past the snapshot\'s own faults, by reason', () => {
    const m = manifest({});
    const expected: Array<[ErrorCode, string]> = [
      ['E_SNAPSHOT_NOT_FOUND', 'missing'],
      ['E_BLOB_MISSING', 'missing'],
      ['E_CHECKSUM', 'damaged'],
      ['E_BLOB_TRUNCATED', 'damaged'],
      ['E_DIGEST_MISMATCH', 'damaged'],
      ['E_MANIFEST_INVALID', 'damaged'],
      ['E_MANIFEST_MISMATCH', 'incompatible'],
      ['E_NOT_DURABLE', 'not-durable'],
    ];
    for (const [code, reason] of expected) expect(recoveryReason(err(code), m, status(), {})).toBe(reason);
  });

  it('never past an error that is not the snapshot\'s (engine, cancellation, answer, stale data, I/O)', () => {
    for (const code of ['E_ENGINE_HTTP', 'E_ENGINE_UNREACHABLE', 'E_ENGINE_STATE', 'E_ABORTED', 'E_RESPONSE_MISMATCH', 'E_STALE', 'E_IO', 'E_CUDA', 'E_NO_SPACE'] as ErrorCode[]) {
      expect(recoveryReason(err(code), manifest({}), status(), {})).toBeUndefined();
    }
  });

  it('never to another model: the engine would reload its own', () => {
    expect(recoveryReason(err('E_CHECKSUM'), manifest({ id: 'org/other' }), status(), {})).toBeUndefined();
    expect(recoveryReason(err('E_CHECKSUM'), manifest({ revision: 'r2' }), status(), {})).toBeUndefined();
    // a model swap to a snapshot that cannot be read: which model was wanted is unknown
    expect(recoveryReason(err('E_SNAPSHOT_NOT_FOUND'), undefined, undefined, { allowModelSwap: true })).toBeUndefined();
    expect(recoveryReason(err('E_SNAPSHOT_NOT_FOUND'), undefined, undefined, {})).toBe('missing');
  });

  it('a snapshot that cannot be pulled (SnapshotRef.from) is missing; a pulled artifact of another model is never recovered', () => {
    for (const code of ['E_REGISTRY', 'E_REGISTRY_AUTH', 'E_REGISTRY_TIMEOUT', 'E_SNAPSHOT_NOT_FOUND'] as ErrorCode[]) expect(recoveryReason(err(code), undefined, undefined, {})).toBe('missing');
    const mismatch = (path: string) => new VsnapError('E_MANIFEST_MISMATCH', 'x', { mismatches: [{ kind: 'field', path, expected: 'a', actual: 'b' }] });
    expect(recoveryReason(mismatch('model.id'), undefined, undefined, {})).toBeUndefined();
    expect(recoveryReason(mismatch('model.revision'), undefined, undefined, {})).toBeUndefined();
    expect(recoveryReason(mismatch('engine.version'), undefined, undefined, {})).toBe('incompatible');
  });

  it('never on an engine whose workers lack reload_weights (older plugins, absent: tried)', () => {
    expect(recoveryReason(err('E_CHECKSUM'), manifest({}), status({}, false), {})).toBeUndefined();
    expect(recoveryReason(err('E_CHECKSUM'), manifest({}), status({}, true), {})).toBe('damaged');
  });
});

describe('expectedFor', () => {
  it('uses the expected response only of the very same model setup', () => {
    expect(expectedFor(manifest({}), status()).response?.tokenIds).toEqual([1, 2]);
    expect(expectedFor(manifest({}, false), status())).toMatchObject({ response: null, why: expect.stringMatching(/no expected response/) });
    expect(expectedFor(undefined, status())).toMatchObject({ response: null, why: expect.stringMatching(/could not be read/) });
    expect(expectedFor(manifest({ dtype: 'float16' }), status())).toMatchObject({ response: null, why: expect.stringMatching(/dtype/) });
  });
});
