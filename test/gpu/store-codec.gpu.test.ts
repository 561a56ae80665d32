// GPU suite, coded store blobs restored into GPU memory without a RAM tier (device only): BF16
// Gaussian weights and random bytes in device memory captured into the store raw and coded
// (capture codec 'vsnap-c1'), restored from the store by the GPU decoder (the coded chunks read
// window by window into pinned memory, decoded by codecRestoreHeld) bit-exact; a damaged header
// refused naming region and chunk with every target untouched; a damaged mantissa byte caught by
// the GPU digest, which runs even with verifyDigests false; read with directIo (O_DIRECT spans)
// bit-exact; no GPU memory for a window's decode scratch (the codec-restore-scratch fault, at the
// first window or a later one) decoded on the CPU instead, bit-exact. Prints `STORE_CODEC_RESULT {json}`:
// seconds of the raw and the coded restore from the store of the same bytes (page cache warm, the
// GPU digest included in both), and of the coded one decoded on the CPU (verify 'all-first').
// Size: VSNAP_GPU_STORE_CODEC_MIB (default 1024) of BF16, in regions of 256 MiB, and 64 MiB of random bytes.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';

import { regionId } from '../../src/manifest/region-id.js';
import { native } from '../../src/native/index.js';
import { codedOffsets } from '../../src/store/coded-blob.js';
import { restoreFromStore } from '../../src/snapshot/store-restore.js';
import { cudaStatus, RegionStore, Snapshot, VsnapError } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { bf16AndNoise, onDevice } from './device-weights.js';

const MiB = 1024 ** 2;
const TOTAL = Number(process.env.VSNAP_GPU_STORE_CODEC_MIB ?? 1024) * MiB;
const REGION = 256 * MiB;
const ROUNDS = 3;

describe('GPU: coded store blobs restored into GPU memory, decoded on the GPU', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  const root = mkdtempSync(join(tmpdir(), 'vsnap-gpu-store-codec-'));
  const rawStore = await RegionStore.open(join(root, 'raw'));
  const codedStore = await RegionStore.open(join(root, 'coded'));
  const device = await onDevice(bf16AndNoise(TOTAL, REGION));
  after(() => {
    device.close();
    rmSync(root, { recursive: true, force: true });
    return releaseIdleResources();
  });
  const { regions, rawBytes, wipe, holdsContents, allZero } = device;
  // Every restore that found no GPU memory for the decode scratch (decoded on the CPU instead): none may be timed as the GPU's.
  const cpuFallbacks: string[] = [];
  const onFallback = (w: Error & { code?: string }): void => {
    if (w.code === 'VSNAP_CODEC') cpuFallbacks.push(w.message);
  };
  const timed = async (restore: () => Promise<unknown>): Promise<number> => {
    await wipe();
    const t0 = performance.now();
    await restore();
    return (performance.now() - t0) / 1000;
  };
  const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
  let coded: Snapshot | undefined;

  it('restores coded store blobs bit-exact on the GPU decoder; seconds against the raw restore of the same bytes', async () => {
    process.on('warning', onFallback);
    const raw = await Snapshot.capture(rawStore, 'm', { regions });
    coded = await Snapshot.capture(codedStore, 'm', { regions, codec: 'vsnap-c1' });
    assert.equal(coded.manifest.data.ranks[0]!.regions.find((r) => r.key === 'noise')!.codec, undefined, 'random bytes stay raw');
    assert.ok(coded.manifest.storedBytes < rawBytes * 0.8, `stored ${coded.manifest.storedBytes} of ${rawBytes}`);

    // the store's own path, to see which decoder ran
    await wipe();
    const targets = new Map(regions.map((r) => [regionId(0, r.key), r]));
    const direct = await restoreFromStore(codedStore, coded.manifest, targets, { label: 'm' }, { verifyFirst: false, directIo: false });
    assert.equal(direct.decodedOnDevice, true, 'decoded on the GPU');
    assert.equal(direct.bytes, rawBytes);
    assert.ok(await holdsContents(), 'restored bit-exact (store path)');

    await wipe();
    const res = await coded.restore({ regions });
    assert.equal(res.tier, 'store');
    assert.ok(res.digestSeconds !== undefined, 'the GPU digest ran');
    assert.ok(await holdsContents(), 'restored bit-exact');

    // page cache warm for both (one restore of each read every blob already), then rounds of each
    await raw.restore({ regions });
    const rawSeconds: number[] = [];
    const codedSeconds: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      rawSeconds.push(await timed(() => raw.restore({ regions })));
      assert.ok(await holdsContents(), 'raw restore bit-exact');
      codedSeconds.push(await timed(() => coded!.restore({ regions })));
      assert.ok(await holdsContents(), 'coded restore bit-exact');
    }
    const cpuSeconds = await timed(() => coded!.restore({ regions, verify: 'all-first' }));
    assert.ok(await holdsContents(), 'coded restore decoded on the CPU bit-exact');
    const result = {
      rawBytes,
      storedRaw: raw.manifest.storedBytes,
      storedCoded: coded.manifest.storedBytes,
      storedRatio: +(coded.manifest.storedBytes / rawBytes).toFixed(3),
      rawSeconds: { best: Math.min(...rawSeconds), median: median(rawSeconds) },
      codedSeconds: { best: Math.min(...codedSeconds), median: median(codedSeconds) },
      codedCpuDecodeSeconds: +cpuSeconds.toFixed(3),
      ratio: +(Math.min(...codedSeconds) / Math.min(...rawSeconds)).toFixed(3),
      pageCache: 'warm',
    };
    await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
    process.off('warning', onFallback);
    assert.deepEqual(cpuFallbacks, [], 'every timed restore decoded on the GPU');
    console.log(`STORE_CODEC_RESULT ${JSON.stringify(result)}`);
  });

  it('a damaged coded header is refused naming region and chunk with every target untouched; a damaged mantissa byte fails the GPU digest even with verifyDigests false', async () => {
    assert.ok(coded, 'needs the capture of the first test');
    const region = coded.manifest.data.ranks[0]!.regions.find((r) => r.key === 'bf16.1')!;
    const path = codedStore.blobPath(region.blob);
    const good = readFileSync(path);
    const at = codedOffsets(region.codec!)[2]!;
    const rewrite = (bytes: Uint8Array): void => {
      rmSync(path);
      writeFileSync(path, bytes);
    };
    const header = Buffer.from(good);
    header.write('XXXX', at);
    rewrite(header);
    await wipe();
    await assert.rejects(
      coded.restore({ regions }),
      (e: unknown) => e instanceof VsnapError && e.code === 'E_CODEC_CORRUPT' && e.details.region === 'bf16.1' && e.details.chunk === 2,
    );
    assert.ok(await allZero(), 'nothing written');

    const mantissa = Buffer.from(good);
    const mid = at + Math.floor(region.codec!.codedSizes[2]! * 0.6);
    mantissa[mid] = mantissa[mid]! ^ 0x01;
    rewrite(mantissa);
    await assert.rejects(
      coded.restore({ regions, verifyDigests: false }),
      (e: unknown) =>
        e instanceof VsnapError &&
        e.code === 'E_DIGEST_MISMATCH' &&
        JSON.stringify(e.details.regions) === JSON.stringify([{ region: '0/bf16.1', chunks: [2] }]),
    );

    rewrite(good);
    await wipe();
    await coded.restore({ regions });
    assert.ok(await holdsContents(), 'restored bit-exact once repaired');
  });
  it('directIo: the windows read with O_DIRECT restore bit-exact on the GPU decoder', async () => {
    assert.ok(coded, 'needs the capture of the first test');
    const targets = new Map(regions.map((r) => [regionId(0, r.key), r]));
    await wipe();
    const direct = await restoreFromStore(codedStore, coded.manifest, targets, { label: 'm' }, { verifyFirst: false, directIo: true });
    assert.equal(direct.decodedOnDevice, true, 'decoded on the GPU');
    assert.ok(await holdsContents(), 'restored bit-exact');
    await wipe();
    await coded.restore({ regions, directIo: true });
    assert.ok(await holdsContents(), 'restored bit-exact (Snapshot.restore)');
  });

  it('no GPU memory for a window\'s decode scratch: the regions left decoded on the CPU (a VSNAP_CODEC warning) bit-exact; the fault consumed', async () => {
    assert.ok(coded, 'needs the capture of the first test');
    const targets = new Map(regions.map((r) => [regionId(0, r.key), r]));
    const warnings: string[] = [];
    const onWarning = (w: Error & { code?: string }): void => {
      if (w.code === 'VSNAP_CODEC') warnings.push(w.message);
    };
    process.on('warning', onWarning);
    const restore = () => restoreFromStore(codedStore, coded!.manifest, targets, { label: 'm' }, { verifyFirst: false, directIo: false, windowBytes: 128 * MiB });
    try {
      // the first window finds no room: every region decoded on the CPU
      native().setFault('codec-restore-scratch', 1);
      await wipe();
      const first = await restore();
      assert.equal(first.decodedOnDevice, false, 'decoded on the CPU');
      assert.equal(first.bytes, rawBytes);
      assert.ok(await holdsContents(), 'restored bit-exact by the CPU path');
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      assert.ok(warnings.some((w) => w.includes('no GPU memory for the codec')), `warned: ${JSON.stringify(warnings)}`);

      // the fault consumed: the next restore decodes on the GPU
      await wipe();
      const next = await restore();
      assert.equal(next.decodedOnDevice, true, 'decoded on the GPU');
      assert.ok(await holdsContents(), 'restored bit-exact by the GPU path');

      // a later window finds no room (two let through): the regions begun on the GPU are finished on the CPU
      native().setFault('codec-restore-scratch', 1, 2);
      await wipe();
      const later = await restore();
      assert.equal(later.decodedOnDevice, true, 'the first windows decoded on the GPU');
      assert.equal(later.bytes, rawBytes);
      assert.ok(await holdsContents(), 'restored bit-exact, GPU and CPU paths together');

      // the whole restore, the GPU digest included
      native().setFault('codec-restore-scratch', 1);
      await wipe();
      const res = await coded.restore({ regions });
      assert.equal(res.tier, 'store');
      assert.ok(await holdsContents(), 'restored bit-exact (Snapshot.restore)');
    } finally {
      native().setFault('codec-restore-scratch', 0);
      process.off('warning', onWarning);
    }
  });
});
