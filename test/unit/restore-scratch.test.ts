// Which failures of a GPU decode send a restore to the CPU decode instead: only the codec restore's
// scratch allocation refused as out of memory (native/codec/codec_restore.cc, before anything was
// issued), never a damaged chunk or another CUDA failure.
import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { restoreScratchShortage } from '../../src/snapshot/device-decode.js';

const cuda = (cudaError: string, call: string) => new VsnapError('E_CUDA', `${call} failed: ${cudaError}`, { cudaError, cudaErrorNumber: 2, call });

describe('restoreScratchShortage', () => {
  it('is the restore scratch refused as out of memory, and nothing else', () => {
    expect(restoreScratchShortage(cuda('CUDA_ERROR_OUT_OF_MEMORY', 'cuMemAlloc (codec restore scratch)'))).toBe(true);
    // the capture's scratch, another call, another error: not a restore scratch shortage
    expect(restoreScratchShortage(cuda('CUDA_ERROR_OUT_OF_MEMORY', 'cuMemAlloc (codec capture scratch)'))).toBe(false);
    expect(restoreScratchShortage(cuda('CUDA_ERROR_OUT_OF_MEMORY', 'cuStreamCreate (codec restore)'))).toBe(false);
    expect(restoreScratchShortage(cuda('CUDA_ERROR_INVALID_VALUE', 'cuMemAlloc (codec restore scratch)'))).toBe(false);
    expect(restoreScratchShortage(new VsnapError('E_CODEC_CORRUPT', 'damaged', { reason: 'magic', call: 'cuMemAlloc (codec restore scratch)' }))).toBe(false);
    expect(restoreScratchShortage(new Error('cuMemAlloc (codec restore scratch): CUDA_ERROR_OUT_OF_MEMORY'))).toBe(false);
  });
});
