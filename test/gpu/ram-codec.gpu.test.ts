// GPU suite, the RAM tier holding coded chunks (device only): BF16 Gaussian weights and random bytes
// in device memory captured into a RamTier with codec 'vsnap-c1' (fewer host bytes held), restored
// from it by the coded path (each coded chunk over the link into two scratch slots and decoded on the
// GPU into the target) bit-exact; a damaged header refused before anything is written; a damaged
// mantissa byte caught by the restore's GPU digest; no GPU memory for the decode's scratch (the
// codec-restore-scratch fault) decoded on the CPU instead, bit-exact. Prints `RAM_CODEC_RESULT {json}`: the coded
// restore's seconds (without and with the check) against the raw pinned H2D copy of the uncompressed
// bytes (bench/ceiling.cu, same run), and the host bytes held against the raw bytes.
// Size: VSNAP_GPU_CODEC_MIB (default 1024) of BF16, in regions of 256 MiB, and 64 MiB of random bytes.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';

import { writeHostBuffer } from '../../src/cache/coded-tier.js';
import { cudaStatus, RamTier, RegionStore, Snapshot, VsnapError, type TransferSummary } from '../../src/index.js';
import { regionId } from '../../src/manifest/region-id.js';
import { native } from '../../src/native/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { restoreCoded } from '../../src/snapshot/coded-restore.js';
import { bf16AndNoise, onDevice } from './device-weights.js';

const MiB = 1024 ** 2;
const TOTAL = Number(process.env.VSNAP_GPU_CODEC_MIB ?? 1024) * MiB;
const REGION = 256 * MiB;
const ROUNDS = 5;

describe('GPU: the RAM tier holding coded chunks', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  const root = mkdtempSync(join(tmpdir(), 'vsnap-gpu-ram-codec-'));
  const store = await RegionStore.open(root);
  const cache = await RamTier.create({ budgetBytes: TOTAL + 128 * MiB, codec: 'vsnap-c1' });
  const cases = bf16AndNoise(TOTAL, REGION);
  const device = await onDevice(cases);
  after(() => {
    device.close();
    cache.close();
    rmSync(root, { recursive: true, force: true });
    return releaseIdleResources();
  });
  const { regions, rawBytes, wipe, holdsContents, allZero } = device;
  // Every restore that found no GPU memory for the decode scratch (decoded on the CPU instead): none may be timed as the GPU's.
  const cpuFallbacks: string[] = [];
  const onFallback = (w: Error & { code?: string }): void => {
    if (w.code === 'VSNAP_CODEC') cpuFallbacks.push(w.message);
  };
  let snap: Snapshot | undefined;

  it('captures coded (host bytes held below 0.72x for BF16 Gaussian), restores bit-exact from RAM; ratio to the raw pinned H2D', async () => {
    process.on('warning', onFallback);
    const captureStarted = performance.now();
    snap = await Snapshot.capture(store, 'coded', { regions, ram: cache });
    const captureSeconds = (performance.now() - captureStarted) / 1000;
    const held = cache.usedBytes;
    const bf16Raw = rawBytes - 64 * MiB;
    assert.ok(held < rawBytes, `held ${held} < raw ${rawBytes}`);
    assert.ok(held - 64 * MiB < bf16Raw * 0.72, `BF16 held ${held - 64 * MiB} < 0.72 x ${bf16Raw}`);
    const plain: number[] = [];
    const checked: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      await wipe();
      const res: TransferSummary = await snap.restore({ regions, ram: cache, verifyDigests: false });
      assert.equal(res.tier, 'ram');
      plain.push(res.seconds);
      assert.ok(await holdsContents(), 'restored bit-exact');
      await wipe();
      const t0 = performance.now();
      await snap.restore({ regions, ram: cache });
      checked.push((performance.now() - t0) / 1000);
    }
    const ceilingBin = process.env.VSNAP_GPU_CEILING;
    assert.ok(ceilingBin && existsSync(ceilingBin), 'VSNAP_GPU_CEILING (bench/ceiling.cu built by test/gpu/run.sh with nvcc) is needed for the ceiling');
    const ceiling = JSON.parse(execFileSync(ceilingBin, [String(ROUNDS), ...cases.map((c) => String(c.bytes.length))], { encoding: 'utf8' })) as { h2dGBps: { max: number; median: number } };
    const ceilingSeconds = rawBytes / (ceiling.h2dGBps.max * 1e9);
    const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
    const result = {
      rawBytes,
      heldBytes: held,
      heldRatio: +(held / rawBytes).toFixed(3),
      heldRatioBf16: +((held - 64 * MiB) / bf16Raw).toFixed(3),
      captureSeconds: +captureSeconds.toFixed(3),
      restoreSeconds: { best: Math.min(...plain), median: median(plain) },
      restoreCheckedSeconds: { best: Math.min(...checked), median: median(checked) },
      ceilingH2dGBps: ceiling.h2dGBps,
      ceilingSeconds: +ceilingSeconds.toFixed(4),
      ratio: +(Math.min(...plain) / ceilingSeconds).toFixed(3),
      ratioChecked: +(Math.min(...checked) / ceilingSeconds).toFixed(3),
      targets: { ratio: 0.75, ratioChecked: 0.8, heldRatio: 0.72 },
    };
    await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
    process.off('warning', onFallback);
    assert.deepEqual(cpuFallbacks, [], 'every timed restore decoded on the GPU');
    console.log(`RAM_CODEC_RESULT ${JSON.stringify(result)}`);
  });

  it('a damaged coded header is refused naming region and chunk before any byte is written; a damaged mantissa byte fails the GPU digest', async () => {
    assert.ok(snap, 'needs the capture of the first test');
    const lease = await cache.acquire(store, snap.manifest); // held while the test damages and repairs it
    try {
    const place = lease.chunks!.get('0/bf16.1')![2]!;
    assert.equal(place.coded, true);
    assert.equal(lease.chunks!.get('0/noise')![0]!.coded, false, 'random bytes stay raw');
    const at = lease.buffer;
    const magic = at.read(place.at, 4);
    await writeHostBuffer(at, place.at, Buffer.from('XXXX'));
    await wipe();
    await assert.rejects(
      snap.restore({ regions, ram: cache }),
      (e: unknown) => e instanceof VsnapError && e.code === 'E_CODEC_CORRUPT' && e.details.region === 'bf16.1' && e.details.chunk === 2,
    );
    assert.ok(await allZero(), 'nothing written');
    await writeHostBuffer(at, place.at, magic);

    const mid = place.at + Math.floor(place.held * 0.6);
    const was = at.read(mid, 1)[0]!;
    await writeHostBuffer(at, mid, Buffer.from([was ^ 0x01]));
    await assert.rejects(snap.restore({ regions, ram: cache }), (e: unknown) => e instanceof VsnapError && e.code === 'E_DIGEST_MISMATCH');
    await writeHostBuffer(at, mid, Buffer.from([was]));
    await wipe();
    await snap.restore({ regions, ram: cache });
    assert.ok(await holdsContents(), 'restored bit-exact once repaired');
    } finally {
      lease.release();
    }
  });
  it('no GPU memory for the decode scratch: the same restore decodes on the CPU (a VSNAP_CODEC warning) bit-exact; the fault consumed, the next restore decodes on the GPU', async () => {
    assert.ok(snap, 'needs the capture of the first test');
    const warnings: string[] = [];
    const onWarning = (w: Error & { code?: string }): void => {
      if (w.code === 'VSNAP_CODEC') warnings.push(w.message);
    };
    process.on('warning', onWarning);
    const targets = new Map(regions.map((r) => [regionId(0, r.key), r]));
    const lease = await cache.acquire(store, snap.manifest);
    try {
      native().setFault('codec-restore-scratch', 1);
      await wipe();
      const cpu = await restoreCoded(snap.manifest, lease, targets, { label: 'coded' });
      assert.equal(cpu.decodedOnDevice, false, 'decoded on the CPU');
      assert.equal(cpu.bytes, rawBytes);
      assert.ok(await holdsContents(), 'restored bit-exact by the CPU path');
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      assert.ok(warnings.some((w) => w.includes('no GPU memory for the codec')), `warned: ${JSON.stringify(warnings)}`);

      await wipe();
      const gpu = await restoreCoded(snap.manifest, lease, targets, { label: 'coded' });
      assert.equal(gpu.decodedOnDevice, true, 'the fault was consumed: decoded on the GPU');
      assert.ok(await holdsContents(), 'restored bit-exact by the GPU path');
    } finally {
      native().setFault('codec-restore-scratch', 0);
      lease.release();
    }
    try {
      // the whole restore with the check, as a wake would run it
      native().setFault('codec-restore-scratch', 1);
      await wipe();
      const res = await snap.restore({ regions, ram: cache });
      assert.equal(res.tier, 'ram');
      assert.ok(res.digestSeconds !== undefined, 'the GPU digest ran');
      assert.ok(await holdsContents(), 'restored bit-exact');
    } finally {
      native().setFault('codec-restore-scratch', 0);
      process.off('warning', onWarning);
    }
  });
});
