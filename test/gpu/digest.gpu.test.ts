// GPU suite, live weights (device only): the digest kernel against the CPU implementation on
// device and imported memory, its throughput against a device-to-device copy, and the reference
// engine on CUDA with weights updated in place (re-captured, never restored stale; incremental;
// a simulated RL loop with every answer checked).
import assert from 'node:assert/strict';
import { closeSync, mkdtempSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { captureEngine, cudaStatus, EngineClient, RegionStore, restoreEngine, Snapshot, suspendEngine } from '../../src/index.js';
import { DeviceAllocation, releaseIdleResources } from '../../src/plumbing.js';
import { digestRegions } from '../../src/digest/index.js';
import { native } from '../../src/native/index.js';
import { askCapital, startEngine, type TestEngine, syncWeights } from '../helpers/engine.js';

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const median = (v: number[]): number => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;

describe('GPU: the digest kernel', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  after(() => releaseIdleResources());

  it('computes exactly the CPU digests on device and imported memory (odd sizes, chunks split over many blocks)', async () => {
    const bytes = randomBytes(70 * MiB + 12301);
    const alloc = await DeviceAllocation.allocate(0, bytes.length);
    const fd = alloc.exportFd();
    try {
      await alloc.write(0, bytes);
      for (const size of [13, 4096, 4096 + 8, 5 * MiB + 40, bytes.length]) {
        for (const chunkSize of [4096, MiB, 5 * MiB + 4096, 64 * MiB]) {
          const expected = native().digestBytes(bytes.subarray(0, size), chunkSize);
          // Imported memory is mapped whole (the driver refuses a partial mapping of an imported
          // handle, CUDA_ERROR_NOT_SUPPORTED, as for transfers: engine regions are whole
          // allocations), so it is digested at the allocation's full size only.
          const whole = size === bytes.length;
          const r = await digestRegions([
            { size, chunkSize, memory: { kind: 'device', allocation: alloc } },
            ...(whole ? [{ size, chunkSize, memory: { kind: 'imported' as const, fd } }] : []),
          ]);
          assert.deepEqual(r.backends, whole ? ['gpu', 'gpu'] : ['gpu']);
          assert.deepEqual(r.digests[0], expected, `device, size ${size}, chunk ${chunkSize}`);
          if (whole) assert.deepEqual(r.digests[1], expected, `imported, size ${size}, chunk ${chunkSize}`);
        }
      }
    } finally {
      closeSync(fd);
      alloc.close();
    }
  });

  it('digests many regions of mixed sizes in one call, each as the CPU does (one launch finds every block its region)', async () => {
    // 97 allocations; the sizes cycle through empty, odd, sub-chunk, multi-chunk and whole, so
    // the table of one launch has neighbours of every kind (and empty ones, which get no block).
    const sizes = [0, 13, 4096 + 8, MiB + 40, 3 * MiB, 2 * MiB + 4096 * 3 + 16];
    const allocs: DeviceAllocation[] = [];
    const contents: Buffer[] = [];
    try {
      for (let i = 0; i < 97; i++) {
        const bytes = randomBytes(3 * MiB);
        const alloc = await DeviceAllocation.allocate(0, bytes.length);
        allocs.push(alloc);
        await alloc.write(0, bytes);
        contents.push(bytes);
      }
      for (const chunkSize of [4096, MiB, 64 * MiB]) {
        const targets = allocs.map((allocation, i) => ({ size: sizes[i % sizes.length]!, chunkSize, memory: { kind: 'device' as const, allocation } }));
        const r = await digestRegions(targets);
        targets.forEach((t, i) => assert.deepEqual(r.digests[i], native().digestBytes(contents[i]!.subarray(0, t.size), chunkSize), `region ${i}, size ${t.size}, chunk ${chunkSize}`));
      }
    } finally {
      for (const a of allocs) a.close();
    }
  });

  it('digests 4,000 regions of 4 MiB about as fast as one region of the same 16 GiB (logged, not asserted)', async () => {
    const n = Number(process.env.VSNAP_GPU_DIGEST_REGIONS ?? 4000);
    const size = 4 * MiB;
    const chunk = 64 * MiB;
    const one = await DeviceAllocation.allocate(0, n * size);
    const many: DeviceAllocation[] = [];
    try {
      await one.fill(0, n * size, 0x3c);
      for (let i = 0; i < n; i++) {
        const a = await DeviceAllocation.allocate(0, size);
        many.push(a);
        await a.fill(0, size, 0x3c);
      }
      const timed = async (targets: Parameters<typeof digestRegions>[0]) => {
        const runs: Array<{ wall: number; kernel: number }> = [];
        let digests: string[][] = [];
        for (let k = 0; k < 3; k++) {
          const r = await digestRegions(targets);
          runs.push({ wall: r.seconds * 1000, kernel: r.kernelSeconds * 1000 });
          digests = r.digests;
        }
        return { wall: median(runs.map((x) => x.wall)), kernel: median(runs.map((x) => x.kernel)), digests };
      };
      const whole = await timed([{ size: n * size, chunkSize: chunk, memory: { kind: 'device', allocation: one } }]);
      const split = await timed(many.map((allocation) => ({ size, chunkSize: chunk, memory: { kind: 'device' as const, allocation } })));
      const expected = native().digestBytes(Buffer.alloc(size, 0x3c), chunk);
      assert.ok(split.digests.every((d) => d.length === 1 && d[0] === expected[0]));
      console.log(
        `digest of ${((n * size) / GiB).toFixed(2)} GiB: one region ${whole.wall.toFixed(2)} ms wall (kernel ${whole.kernel.toFixed(2)}); ` +
          `${n} regions of 4 MiB ${split.wall.toFixed(2)} ms wall (kernel ${split.kernel.toFixed(2)}); ${(split.wall / whole.wall).toFixed(2)}x`,
      );
    } finally {
      one.close();
      for (const a of many) a.close();
    }
  });

  it('digests 16 GiB at memory speed: kernel time vs a device-to-device copy of the same bytes', async () => {
    const gib = Number(process.env.VSNAP_GPU_DIGEST_GIB ?? 16);
    const size = gib * GiB;
    const chunk = 64 * MiB;
    const src = await DeviceAllocation.allocate(0, size);
    const dst = await DeviceAllocation.allocate(0, size);
    try {
      await src.fill(0, size, 0x5a);
      const t = await native().digestBench(src.handle, dst.handle, size, chunk, 5);
      const best = Math.min(...t.digestMs);
      const copy = Math.min(...t.copyMs);
      console.log(
        `digest of ${gib} GiB: kernel ${t.digestMs.map((x) => x.toFixed(2)).join(', ')} ms (best ${(size / best / 1e6).toFixed(0)} GB/s); ` +
          `D2D copy ${t.copyMs.map((x) => x.toFixed(2)).join(', ')} ms (best ${(size / copy / 1e6).toFixed(0)} GB/s copied); digest/copy time ${(best / copy).toFixed(2)}`,
      );
      // Every chunk holds the same bytes, so every GPU digest equals the CPU digest of one chunk.
      const r = await digestRegions([{ size, chunkSize: chunk, memory: { kind: 'device', allocation: src } }]);
      const one = native().digestBytes(Buffer.alloc(chunk, 0x5a), chunk)[0];
      assert.equal(r.digests[0]!.length, size / chunk);
      assert.ok(r.digests[0]!.every((d) => d === one));
      console.log(`digest of ${gib} GiB through the SDK: ${(r.seconds * 1000).toFixed(2)} ms wall, kernel ${(r.kernelSeconds * 1000).toFixed(2)} ms`);
    } finally {
      src.close();
      dst.close();
    }
  });
});

describe('GPU: live weights of the reference engine', async () => {
  const status = await cudaStatus();
  if (!status.available) return;
  let engine: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let dir: string;
  const ask = (c: EngineClient) => askCapital(c, 16);
  const update = (seed: number, layers?: number[]) => syncWeights(client.baseUrl, seed, layers); // vLLM's weight-sync API

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-live-'));
    store = await RegionStore.open(dir);
    engine = await startEngine({ device: 'cuda', seed: 1, args: ['--layers', '8', '--hidden', '1024'] });
    client = new EngineClient({ baseUrl: engine.url, token: engine.token });
  });
  after(async () => {
    await client?.close();
    await engine?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it('weights updated in place are re-captured, not restored stale: the answer after restore is the new one, bit for bit', async () => {
    const first = await captureEngine(store, 'live', client);
    assert.equal(first.manifest.data.digestAlgorithm, 'vsnap-gd1');
    const old = await ask(client);
    await update(2);
    const fresh = await ask(client);
    assert.notDeepEqual(fresh.ids, old.ids);
    const s = await suspendEngine(store, 'live', client);
    assert.equal(s.captured, true);
    assert.ok(s.liveCheck!.checked && s.liveCheck!.changed.length > 0);
    console.log(`suspend after an update: ${s.liveCheck!.changed.length} changed regions; phases ${JSON.stringify(s.phases)}`);
    const r = await restoreEngine(s.snapshot, client);
    console.log(`restore: phases ${JSON.stringify(r.phases)}`);
    assert.ok(r.phases.verifyDigests !== undefined, 'the restored memory is verified on the GPU');
    assert.deepEqual(await ask(client), fresh);
  });

  it('incremental: one layer changed, only its regions are read again', async () => {
    await captureEngine(store, 'live', client);
    const answer0 = await ask(client);
    await update(3, [4]);
    const answer = await ask(client);
    assert.notDeepEqual(answer.ids, answer0.ids);
    const s = await suspendEngine(store, 'live', client);
    const c = s.snapshot.lastCapture!;
    console.log(`incremental: ${s.liveCheck!.changed.length} regions changed; read ${(c.bytes / MiB).toFixed(1)} MiB, shared ${((c.reusedBytes ?? 0) / MiB).toFixed(1)} MiB`);
    assert.ok(s.captured && c.reusedBytes! > 0 && c.bytes < c.reusedBytes!, JSON.stringify(c));
    await restoreEngine(s.snapshot, client);
    assert.deepEqual(await ask(client), answer);
  });

  it('a simulated RL loop: update, suspend, restore, 20 times, every answer checked', async () => {
    const steps: Array<{ digest: number; capture: number; suspend: number; restore: number; verify: number }> = [];
    for (let step = 1; step <= 20; step++) {
      await update(100 + step);
      const answer = await ask(client);
      const s = await suspendEngine(store, 'live', client);
      assert.equal(s.captured, true, `step ${step}: the new weights must be captured`);
      const r = await restoreEngine(s.snapshot, client);
      assert.deepEqual(await ask(client), answer, `step ${step}`);
      steps.push({ digest: s.phases.digest ?? 0, capture: s.phases.capture ?? 0, suspend: s.seconds, restore: r.seconds, verify: r.phases.verifyDigests ?? 0 });
    }
    const ms = (k: keyof (typeof steps)[0]) => (median(steps.map((x) => x[k])) * 1000).toFixed(1);
    console.log(`RL loop, median per step: dirty check ${ms('digest')} ms, re-capture ${ms('capture')} ms, suspend ${ms('suspend')} ms, restore ${ms('restore')} ms (GPU verification ${ms('verify')} ms)`);
  });
});
