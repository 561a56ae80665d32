// GPU suite, tier 0 (device only): weights kept on the GPU across sleep and mapped back.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cudaStatus, EngineClient, RamTier, RegionStore, GpuTier, restoreEngine, Snapshot, suspendEngine } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { engineTierUnsupported } from '../helpers/vllm-src.js';
import { gpuMemoryOf, gpuUsedMiB } from './nvidia-smi.js';

const GiB = 1024 ** 3;
const SMALL = ['--layers', '18', '--hidden', '2048'];
const LARGE = ['--layers', '36', '--hidden', '4096'];

const ms = (s: number) => `${(s * 1000).toFixed(1)} ms`;
function stats(v: number[]): string {
  const s = [...v].sort((a, b) => a - b);
  return `min ${ms(s[0]!)}, median ${ms(s[Math.floor(s.length / 2)]!)}, max ${ms(s.at(-1)!)}`;
}
const ask = (c: EngineClient) => askCapital(c, 16);

describe('GPU: tier 0, weights resident across sleep', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  const engines: Array<{ e: TestEngine; c: EngineClient }> = [];
  let dir: string;
  let store: RegionStore;

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-tier0-'));
    store = await RegionStore.open(dir);
    for (const seed of [1, 2]) {
      const e = await startEngine({ device: 'cuda', seed, model: `m${seed}`, args: SMALL });
      engines.push({ e, c: new EngineClient({ baseUrl: e.url, token: e.token }) });
    }
  });
  after(async () => {
    for (const x of engines) {
      await x.c.close();
      await x.e.stop();
    }
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it("the engine's own tier 0 (release_kv_cache_memory) next to the SDK-held one: 10 rounds each, bit-identical answers", async (t) => {
    const unsupported = engineTierUnsupported();
    if (unsupported) {
      t.skip(unsupported);
      return;
    }
    const { e, c } = engines[0]!;
    const answer = await ask(c);
    const own = { suspend: [] as number[], resume: [] as number[] };
    for (let i = 0; i < 10; i++) {
      const s = await suspendEngine(store, 'own', c, { tiers: { engine: true } });
      own.suspend.push(s.seconds);
      if (i === 0) console.log(`engine tier 0 (${s.tier}): engine holds ${gpuMemoryOf(e.enginePid)} MiB while suspended`);
      own.resume.push((await restoreEngine({ store, name: 'own' }, c, { tiers: { engine: true } })).seconds);
      assert.deepEqual(await ask(c), answer);
    }
    const resident = new GpuTier();
    const sdk = { suspend: [] as number[], resume: [] as number[] };
    try {
      for (let i = 0; i < 10; i++) {
        const s = await suspendEngine(store, 'own-vs-sdk', c, { captureIfNeeded: true, tiers: { gpu: resident } });
        sdk.suspend.push(s.seconds);
        const r = await restoreEngine(s.snapshot, c, { tiers: { gpu: resident } });
        assert.equal(r.tier, 'gpu');
        sdk.resume.push(r.seconds);
        assert.deepEqual(await ask(c), answer);
      }
    } finally {
      resident.close();
    }
    console.log(`engine tier 0: suspend ${stats(own.suspend)}; resume ${stats(own.resume)}`);
    console.log(`SDK-held tier 0: suspend ${stats(sdk.suspend.slice(1))} (first, with capture: ${ms(sdk.suspend[0]!)}); restore ${stats(sdk.resume)}`);
  });

  it('20 tier-0 swaps between two 2.4 GiB engines: bit-identical answers, no bytes moved, memory accounted', async () => {
    const resident = new GpuTier();
    const [a, b] = engines as [{ e: TestEngine; c: EngineClient }, { e: TestEngine; c: EngineClient }];
    const answers = [await ask(a.c), await ask(b.c)];
    const usedAwake = gpuUsedMiB();
    const sa = await suspendEngine(store, 'a', a.c, { captureIfNeeded: true, tiers: { gpu: resident } });
    const usedHeld = gpuUsedMiB();
    console.log(`tier 0 holds ${(resident.bytes / GiB).toFixed(2)} GiB; GPU used ${usedAwake} MiB awake -> ${usedHeld} MiB after a tier-0 suspend (engine ${gpuMemoryOf(a.e.enginePid)} MiB, this process ${gpuMemoryOf(process.pid)} MiB)`);
    const sb = await suspendEngine(store, 'b', b.c, { captureIfNeeded: true, tiers: { gpu: resident } });
    const snaps = [sa.snapshot, sb.snapshot];
    const adopt: number[] = [];
    const total: number[] = [];
    const suspend: number[] = [];
    for (let i = 0; i < 20; i++) {
      const k = i % 2;
      const x = engines[k]!;
      const r = await restoreEngine(snaps[k]!, x.c, { tiers: { gpu: resident } });
      assert.equal(r.tier, 'gpu');
      adopt.push(r.phases.adoptWeights!);
      total.push(r.seconds);
      assert.deepEqual(await ask(x.c), answers[k], `round ${i}`);
      const t = performance.now();
      await suspendEngine(store, k === 0 ? 'a' : 'b', x.c, { tiers: { gpu: resident } });
      suspend.push((performance.now() - t) / 1000);
    }
    console.log(`tier-0 restore, 2.4 GiB: adopt weights ${stats(adopt)}; end to end incl. expected response ${stats(total)}; tier-0 suspend ${stats(suspend)}`);
    const before = gpuUsedMiB();
    resident.release(a.c.baseUrl);
    const afterRelease = gpuUsedMiB();
    console.log(`demotion of one engine's weights: GPU used ${before} -> ${afterRelease} MiB (SDK said ${((resident.bytes + 0) / GiB).toFixed(2)} GiB still held)`);
    assert.ok(before - afterRelease >= 2 * 1024, 'releasing tier 0 frees the weights');
    resident.close();
    for (const [k, x] of engines.entries()) {
      await restoreEngine(snaps[k]!, x.c);
      assert.deepEqual(await ask(x.c), answers[k]);
    }
  });

  it('a crash of the SDK process holding tier 0: the driver frees the memory, the engine restores from the store', async () => {
    const a = engines[0]!;
    const answer = await ask(a.c);
    const child = spawn(process.execPath, [join(process.cwd(), 'dist-gpu', 'gpu-tier-child.mjs'), a.e.url, a.e.token, dir], { stdio: ['ignore', 'pipe', 'inherit'], env: process.env });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => d.toString().includes('holding') && resolve());
      child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
    });
    const held = gpuUsedMiB();
    child.kill('SIGKILL');
    await new Promise((r) => child.on('exit', r));
    await new Promise((r) => setTimeout(r, 500));
    const freed = gpuUsedMiB();
    console.log(`SDK killed while holding tier 0: GPU used ${held} -> ${freed} MiB`);
    assert.ok(held - freed >= 2 * 1024, 'the driver freed the held weights');
    assert.equal((await a.c.wire.vsnapStatus()).sleeping, true);
    const r = await restoreEngine((await Snapshot.open(store, 'a')), a.c, { tiers: { gpu: new GpuTier() } });
    assert.equal(r.tier, 'store');
    assert.deepEqual(await ask(a.c), answer);
  });

  it('16 GiB engine: tier-0 restore vs RAM-tier restore', async () => {
    for (const x of engines) await suspendEngine(store, x === engines[0] ? 'a' : 'b', x.c); // make room
    const big = await startEngine({ device: 'cuda', seed: 3, model: 'big', args: LARGE, startTimeoutMs: 400_000 });
    const c = new EngineClient({ baseUrl: big.url, token: big.token });
    const resident = new GpuTier();
    try {
      const bytes = (await c.wire.vsnapStatus()).ranks[0]!.bytes;
      const answer = await ask(c);
      const s = await suspendEngine(store, 'big', c, { captureIfNeeded: true, tiers: { gpu: resident } });
      const gpu = [];
      for (let i = 0; i < 3; i++) {
        const r = await restoreEngine(s.snapshot, c, { tiers: { gpu: resident } });
        assert.equal(r.tier, 'gpu');
        gpu.push(r);
        assert.deepEqual(await ask(c), answer);
        await suspendEngine(store, 'big', c, { tiers: { gpu: i < 2 ? resident : undefined } });
      }
      const cache = await RamTier.create({ budgetBytes: bytes + GiB });
      try {
        await cache.load(store, s.snapshot.manifest);
        const ram = await restoreEngine(s.snapshot, c, { tiers: { ram: cache } });
        assert.equal(ram.tier, 'ram');
        assert.deepEqual(await ask(c), answer);
        console.log(
          `${(bytes / GiB).toFixed(2)} GiB engine: tier 0 adopt ${gpu.map((r) => ms(r.phases.adoptWeights!)).join(', ')} ` +
            `(end to end ${gpu.map((r) => ms(r.seconds)).join(', ')}); RAM tier hydrate ${ms(ram.phases.hydrate!)} (end to end ${ms(ram.seconds)}); ` +
            `expected response ${ms(ram.phases.expectedResponse!)}`,
        );
      } finally {
        cache.close();
      }
    } finally {
      resident.close();
      await c.close();
      await big.stop();
    }
  });
});
