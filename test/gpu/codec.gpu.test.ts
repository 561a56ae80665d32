// GPU suite, the vsnap-c1 codec (device only): every kind of chunk encoded and decoded on the
// GPU, the GPU's coded bytes equal to the CPU encoder's, CPU-coded chunks decoded on the GPU and
// GPU-coded ones on the CPU, and damaged chunks refused (E_CODEC_CORRUPT) without a crash.
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';

import { cudaStatus } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { decodeChunk, decodeChunkOnDevice, encodeChunk, encodeChunkOnDevice, type CodecKind } from '../../src/transfer/codec.js';
import type { VsnapError } from '../../src/errors.js';
import { native } from '../../src/native/index.js';
import { corpus, weights } from '../helpers/codec-data.js';

const KINDS: CodecKind[] = ['bytes', 'bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2'];
const ref = { chunk: 0, region: 'gpu-test' };

describe('GPU: the vsnap-c1 codec', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  // one context for the whole suite: each call would otherwise make and drop the device's context
  await native().cudaKeepContext(0);
  after(async () => {
    await native().cudaReleaseContext(0);
    await releaseIdleResources();
  });

  async function both(bytes: Buffer, hint: CodecKind, what: string): Promise<void> {
    const cpu = encodeChunk(bytes, hint);
    const { coded: gpu } = await encodeChunkOnDevice(bytes, hint, 0);
    assert.ok(gpu.equals(cpu), `${what}: the GPU's coded bytes differ from the CPU's (${gpu.length} against ${cpu.length})`);
    const { data } = await decodeChunkOnDevice(cpu, bytes.length, 0, ref);
    assert.ok(data.equals(bytes), `${what}: the GPU decode of the CPU's chunk differs`);
    assert.ok(decodeChunk(gpu, bytes.length, ref).equals(bytes), `${what}: the CPU decode of the GPU's chunk differs`);
  }

  it('encodes the same bytes as the CPU and decodes them back, for every kind of chunk (4 MiB + 3 bytes)', async () => {
    for (const c of corpus(4 * 1024 * 1024 + 3)) await both(c.bytes, c.hint, c.name);
  });

  it('every hint, odd sizes and unaligned tails (blocks split mid-thread, tails of 1-3 bytes)', async () => {
    const sizes = [1, 3, 5, 17, 4095, 4097, 8193, 12_289, 65_537, 300_007];
    for (const c of corpus(300_007)) {
      for (const size of sizes) {
        for (const hint of KINDS) await both(c.bytes.subarray(0, size), hint, `${c.name} [${size}] as ${hint}`);
      }
    }
  });

  it('one 64 MiB chunk of each dtype (the transfer chunk), both ways', async () => {
    for (const kind of ['bf16', 'fp16', 'fp32', 'fp8-e4m3', 'fp8-e5m2'] as const) await both(weights(kind, 'gaussian', 64 * 1024 * 1024, 17), kind, `${kind} 64 MiB`);
  });

  it('refuses damaged chunks on the GPU path as on the CPU: E_CODEC_CORRUPT, or the bytes the CPU decoder gives', async () => {
    const raw = weights('bf16', 'heavy', 300_001, 23);
    const coded = encodeChunk(raw, 'bf16');
    let refused = 0;
    for (let i = 0; i < 300; i++) {
      const bad = Buffer.from(coded);
      bad[(i * 7919) % bad.length] = bad[(i * 7919) % bad.length]! ^ 1 + (i % 255);
      bad[(i * 104_729 + 13) % bad.length] = bad[(i * 104_729 + 13) % bad.length]! ^ 0x40;
      let cpu: Buffer | undefined;
      try {
        cpu = decodeChunk(bad, raw.length, ref);
      } catch (err) {
        assert.equal((err as VsnapError).code, 'E_CODEC_CORRUPT');
      }
      try {
        const { data } = await decodeChunkOnDevice(bad, raw.length, 0, ref);
        // the GPU decoder checks the block table's escapes as the CPU does: same verdict, same bytes
        assert.ok(cpu?.equals(data), `damage ${i}: the GPU decoded what the CPU refused or decoded differently`);
      } catch (err) {
        assert.equal((err as VsnapError).code, 'E_CODEC_CORRUPT', String(err));
        assert.equal(cpu, undefined, `damage ${i}: the GPU refused what the CPU decoded`);
        refused++;
      }
    }
    assert.ok(refused > 0);
  });
});
