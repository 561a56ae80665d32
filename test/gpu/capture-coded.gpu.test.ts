// GPU suite, captures coded on the GPU (device only): BF16 and FP16 Gaussian weights, random bytes,
// zeros and a region with an unaligned tail, in device memory, captured into a RamTier with codec
// 'vsnap-c1'. Each chunk is encoded on its GPU and only its coded bytes cross the link (persist
// 'off' with hash 'deferred', and persist 'sync' after the store's raw pass); every chunk held must
// equal the CPU encoder's bytes for the raw chunk (or the raw chunk where it did not shrink), and the
// restore from the tier (decoded on the GPU, checked against the capture-time GPU digests of the raw
// bytes) bit-exact; the RAM-only capture persisted (decoded on the CPU) restores bit-exact from the
// store; with no GPU memory for the scratch (a fault point), a RAM-only capture lands raw and is coded on
// the CPU instead of failing. Prints `CAPTURE_CODED_RESULT {json}`: the coded capture's seconds against a raw capture of
// the same regions into an uncoded RAM tier (same run), and the bytes held against the raw bytes.
// Size: VSNAP_GPU_CODEC_MIB (default 512) of BF16, in regions of 128 MiB, beside the small regions.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';

import { randomChunk, weights } from '../helpers/codec-data.js';
import type { HeldChunk } from '../../src/cache/coded-tier.js';
import { cudaStatus, RamTier, RegionStore, Snapshot } from '../../src/index.js';
import { native } from '../../src/native/index.js';
import { encodeChunk, releaseIdleResources, type CodecKind } from '../../src/plumbing.js';
import { onDevice } from './device-weights.js';

const MiB = 1024 ** 2;
const CHUNK = 64 * MiB;
const BF16 = Number(process.env.VSNAP_GPU_CODEC_MIB ?? 512) * MiB;
const REGION = 128 * MiB;

describe('GPU: captures coded on the GPU into the RAM tier', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  const root = mkdtempSync(join(tmpdir(), 'vsnap-gpu-capture-coded-'));
  const store = await RegionStore.open(root);
  const cases: Array<{ key: string; hint: CodecKind; bytes: Buffer }> = [];
  for (let i = 0; i * REGION < BF16; i++) {
    const size = Math.min(REGION, BF16 - i * REGION);
    cases.push({ key: `bf16.${i}`, hint: 'bf16', bytes: Buffer.concat(Array.from({ length: size / CHUNK }, (_, k) => weights('bf16', 'gaussian', CHUNK, 1 + i * 8 + k))) });
  }
  cases.push({ key: 'fp16', hint: 'fp16', bytes: weights('fp16', 'heavy', CHUNK, 77) });
  cases.push({ key: 'noise', hint: 'bytes', bytes: randomChunk(CHUNK, 99) });
  cases.push({ key: 'zeros', hint: 'bytes', bytes: Buffer.alloc(CHUNK) });
  // a tail chunk of an odd size (not a whole number of elements)
  cases.push({ key: 'tail', hint: 'bf16', bytes: weights('bf16', 'gaussian', CHUNK + 3 * MiB + 4096 + 6, 5).subarray(0, CHUNK + 3 * MiB + 4096 + 5) });
  const rawBytes = cases.reduce((n, c) => n + c.bytes.length, 0);
  const budget = rawBytes + 64 * MiB;
  const coded = await RamTier.create({ budgetBytes: budget, codec: 'vsnap-c1' });
  const plain = await RamTier.create({ budgetBytes: budget });
  const dtype = { bf16: 'torch.bfloat16', fp16: 'torch.float16', bytes: 'torch.uint8' } as Record<CodecKind, string>;
  const device = await onDevice(cases.map((c) => ({ ...c, tensor: { dtype: dtype[c.hint], elements: c.bytes.length } })));
  after(() => {
    device.close();
    coded.close();
    plain.close();
    rmSync(root, { recursive: true, force: true });
    return releaseIdleResources();
  });
  const { regions, wipe, holdsContents } = device;
  /** Every chunk the tier holds is the CPU encoder's bytes for the raw chunk, or the raw chunk where that did not shrink. */
  const heldAsCpuEncodes = async (snap: Snapshot): Promise<{ coded: number; raw: number }> => {
    const lease = await coded.acquire(store, snap.manifest);
    const counts = { coded: 0, raw: 0 };
    try {
      assert.ok(lease.chunks, 'held coded');
      for (const c of cases) {
        const held: readonly HeldChunk[] = lease.chunks.get(`0/${c.key}`)!;
        assert.equal(held.length, Math.ceil(c.bytes.length / CHUNK));
        held.forEach((h, k) => {
          const raw = c.bytes.subarray(k * CHUNK, (k + 1) * CHUNK);
          const cpu = encodeChunk(raw, c.hint);
          const bytes = lease.buffer.read(h.at, h.held);
          assert.equal(h.at % 16, 0);
          if (cpu.length < raw.length) {
            assert.ok(h.coded, `${c.key} chunk ${k} coded`);
            assert.ok(bytes.equals(cpu), `${c.key} chunk ${k}: the GPU's coded bytes equal the CPU encoder's`);
            counts.coded++;
          } else {
            assert.ok(!h.coded, `${c.key} chunk ${k} held raw`);
            assert.ok(bytes.equals(raw), `${c.key} chunk ${k}: the raw bytes`);
            counts.raw++;
          }
        });
      }
    } finally {
      lease.release();
    }
    return counts;
  };

  let captureSeconds = 0;
  let heldBytes = 0;
  it('a RAM-only capture (persist off, hash deferred) is coded on the GPU: CPU encoder bytes, bit-exact restore from RAM, persisted and restored from the store', async () => {
    const t0 = performance.now();
    const snap = await Snapshot.capture(store, 'ram-only', { regions, ram: coded, persist: 'off' });
    captureSeconds = (performance.now() - t0) / 1000;
    heldBytes = coded.usedBytes;
    assert.equal(snap.manifest.checksummed, false);
    assert.ok(heldBytes < rawBytes * 0.8, `held ${heldBytes} < 0.8 x raw ${rawBytes}`);
    const counts = await heldAsCpuEncodes(snap);
    assert.ok(counts.coded > 0 && counts.raw > 0, `coded and raw chunks both present: ${JSON.stringify(counts)}`);
    await wipe();
    const r = await snap.restore({ regions, ram: coded });
    assert.equal(r.tier, 'ram');
    assert.ok(r.digestSeconds !== undefined, 'checked against the capture-time GPU digests of the raw bytes');
    assert.ok(await holdsContents(), 'restored bit-exact from the RAM tier');
    await snap.persist();
    assert.equal(snap.manifest.checksummed, true);
    await wipe();
    await (await Snapshot.open(store, 'ram-only')).restore({ regions });
    assert.ok(await holdsContents(), 'restored bit-exact from the store');
    assert.ok(coded.evict(snap.id));
  });

  it('a capture persisted to the store (sync) lands in the RAM tier coded on the GPU: CPU encoder bytes, bit-exact restore', async () => {
    const snap = await Snapshot.capture(store, 'sync', { regions, ram: coded });
    await heldAsCpuEncodes(snap);
    await wipe();
    const r = await snap.restore({ regions, ram: coded });
    assert.equal(r.tier, 'ram');
    assert.ok(await holdsContents(), 'restored bit-exact');
    assert.ok(coded.evict(snap.id));
  });

  it('a RAM-only capture hashed now lands raw and is coded on the CPU: the same bytes', async () => {
    const snap = await Snapshot.capture(store, 'now', { regions, ram: coded, persist: 'off', hash: 'now' });
    await heldAsCpuEncodes(snap);
    await wipe();
    await snap.restore({ regions, ram: coded });
    assert.ok(await holdsContents(), 'restored bit-exact');
    assert.ok(coded.evict(snap.id));
  });

  it('no GPU memory for the scratch: a RAM-only capture lands raw and is coded on the CPU (a warning), the same bytes', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error & { code?: string }): void => {
      if (w.code === 'VSNAP_RAM_TIER') warnings.push(w.message);
    };
    process.on('warning', onWarning);
    native().setFault('codec-scratch', 1);
    try {
      const snap = await Snapshot.capture(store, 'short', { regions, ram: coded, persist: 'off' });
      await heldAsCpuEncodes(snap);
      await wipe();
      await snap.restore({ regions, ram: coded });
      assert.ok(await holdsContents(), 'restored bit-exact');
      assert.ok(coded.evict(snap.id));
      assert.ok(warnings.some((w) => w.includes('no GPU memory for the codec')), `warned: ${JSON.stringify(warnings)}`);
    } finally {
      native().setFault('codec-scratch', 0);
      process.off('warning', onWarning);
    }
  });

  it('reports the coded capture against a raw capture into an uncoded RAM tier (same regions, same run)', async () => {
    const raw: number[] = [];
    const gpu: number[] = [];
    for (let r = 0; r < 3; r++) {
      let t0 = performance.now();
      const a = await Snapshot.capture(store, 'raw', { regions, ram: plain, persist: 'off' });
      raw.push((performance.now() - t0) / 1000);
      assert.ok(plain.evict(a.id));
      t0 = performance.now();
      const b = await Snapshot.capture(store, 'coded', { regions, ram: coded, persist: 'off' });
      gpu.push((performance.now() - t0) / 1000);
      assert.ok(coded.evict(b.id));
    }
    const result = {
      rawBytes,
      heldBytes,
      heldRatio: +(heldBytes / rawBytes).toFixed(3),
      firstCodedCaptureSeconds: +captureSeconds.toFixed(3),
      codedCaptureSeconds: Math.min(...gpu),
      rawCaptureSeconds: Math.min(...raw),
      ratio: +(Math.min(...gpu) / Math.min(...raw)).toFixed(3),
      note: 'both include the capture-time GPU digest; BF16/FP16 are synthetic Gaussian/heavy-tailed draws',
    };
    console.log(`CAPTURE_CODED_RESULT ${JSON.stringify(result)}`);
  });
});
