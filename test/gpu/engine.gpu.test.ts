// GPU suite, engine bridge (device only): the reference engine (test/fixtures/engine) on CUDA
// with a ~2.2 GiB transformer, driven through the vsnap plugin and the SDK.
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { captureEngine, cudaStatus, EngineClient, RamTier, RegionStore, restoreEngine, Snapshot, suspendEngine, VsnapError } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { gpuMemoryOf } from './nvidia-smi.js';

const GiB = 1024 ** 3;
const MODEL_ARGS = ['--layers', '18', '--hidden', '2048'];

const ask = (client: EngineClient) => askCapital(client, 16);
/** How many forward passes the engine replayed from the CUDA graphs it captured at start-up (reference only). */
const replays = async (client: EngineClient) => Number((await client.wire.collectiveRpc('ref_graph_replays'))![0]);

describe('GPU: capture, suspend and restore the reference engine', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  let a: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let dir: string;

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-engine-'));
    store = await RegionStore.open(dir);
    a = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS });
    client = new EngineClient({ baseUrl: a.url, token: a.token });
  });

  after(async () => {
    await client?.close();
    await a?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it('greedy answer identical (token ids and logprobs, bit for bit) after capture, suspend and restore; memory freed while asleep', async () => {
    const engineStatus = await client.wire.vsnapStatus();
    const rank = engineStatus.ranks[0]!;
    assert.equal(rank.memory, 'cuda');
    assert.ok(rank.bytes >= 2 * GiB, `weights ${rank.bytes} bytes`);
    console.log(`engine: ${rank.regions} weights regions, ${(rank.bytes / GiB).toFixed(2)} GiB; rehome at load: ${JSON.stringify((rank as { rehome?: unknown }).rehome)}`);
    const before = await ask(client);
    const served = await replays(client);
    assert.ok(served >= 16, `the answer's 16 forward passes replayed CUDA graphs (${served})`);

    const t0 = performance.now();
    const snap = await captureEngine(store, 'ref', client);
    console.log(`capture: ${((performance.now() - t0) / 1000).toFixed(2)} s (transfer ${snap.lastCapture!.seconds.toFixed(2)} s, ${(snap.lastCapture!.bytesPerSecond / 1e9).toFixed(2)} GB/s to disk)`);
    assert.equal(snap.manifest.data.platform.kind, 'cuda');
    assert.ok(snap.manifest.data.ranks[0]!.regions.some((r) => r.key.startsWith('anon:') || r.tensors.length > 0));

    const awakeMiB = gpuMemoryOf(a.enginePid);
    const s0 = performance.now();
    await suspendEngine(store, 'ref', client);
    const asleepMiB = gpuMemoryOf(a.enginePid);
    console.log(`suspend: ${((performance.now() - s0) / 1000).toFixed(3)} s; engine GPU memory ${awakeMiB} MiB awake -> ${asleepMiB} MiB asleep`);
    assert.ok(awakeMiB !== null && asleepMiB !== null && awakeMiB - asleepMiB >= 2 * 1024, 'sleep must free the weights');

    const cache = await RamTier.create({ budgetBytes: 3 * GiB });
    try {
      for (let round = 1; round <= 4; round++) {
        // rounds 1-2 stream from the store (page cache); 3 loads the RAM tier; 4 restores from it
        const report = await restoreEngine(snap, client, round >= 3 ? { tiers: { ram: cache } } : {});
        const phases = Object.entries(report.phases).map(([k, v]) => `${k} ${(v * 1000).toFixed(1)} ms`).join(', ');
        console.log(`restore ${round}: ${(report.seconds * 1000).toFixed(1)} ms total (${(report.bytes / GiB).toFixed(2)} GiB from ${report.tier}): ${phases}`);
        const replayed = await replays(client);
        assert.deepEqual(await ask(client), before);
        // the graphs captured before the first sleep read the restored weights at their addresses
        assert.ok((await replays(client)) >= replayed + 16, 'the answer after the restore came from the CUDA graphs');
        if (round < 4) await suspendEngine(store, 'ref', client);
      }
    } finally {
      cache.close();
    }
  });

  it('a corrupted blob: refused, engine asleep and recoverable', async () => {
    const snap = await Snapshot.open(store, 'ref');
    const region = [...snap.manifest.regions()].sort((x, y) => y.region.size - x.region.size)[0]!.region;
    const path = store.blobPath(region.blob);
    const original = readFileSync(path);
    const bad = Buffer.from(original);
    const mid = bad.length >> 1;
    bad.writeUInt8(bad.readUInt8(mid) ^ 0x40, mid);
    chmodSync(path, 0o644);
    writeFileSync(path, bad);
    const before = await ask(client);
    await suspendEngine(store, 'ref', client);
    await assert.rejects(restoreEngine(snap, client), (err: VsnapError) => {
      assert.equal(err.code, 'E_CHECKSUM');
      assert.equal(err.details.recovered, true);
      return true;
    });
    assert.equal((await client.wire.vsnapStatus()).sleeping, true);
    writeFileSync(path, original); // the good bytes back: the same snapshot now restores
    await restoreEngine(snap, client);
    assert.deepEqual(await ask(client), before);
  });

  it("a deleted blob: recovered through the engine's own reload_weights, answer bit-identical; the new snapshot (materialize required) restores", async () => {
    const before = await ask(client);
    const snap = await suspendEngine(store, 'ref', client).then((r) => r.snapshot);
    const region = [...snap.manifest.regions()].sort((x, y) => y.region.size - x.region.size)[0]!.region;
    rmSync(store.blobPath(region.blob));
    const loads = async () => Number((await client.wire.collectiveRpc('ref_weight_loads'))![0]);
    const loaded = await loads();
    const report = await restoreEngine(snap, client, { onWarning: () => undefined, recovery: { policy: 'reload', materialize: 'required' } });
    const phases = Object.entries(report.phases).map(([k, v]) => `${k} ${(v * 1000).toFixed(1)} ms`).join(', ');
    console.log(`recovery: ${(report.seconds * 1000).toFixed(1)} ms total (${(report.bytes / GiB).toFixed(2)} GiB reloaded by the engine): ${phases}`);
    assert.equal(report.path, 'recovered');
    assert.equal(report.recovery!.reason, 'missing');
    assert.equal(report.recovery!.expectedResponse, 'matched');
    assert.equal(await loads(), loaded + 1);
    assert.deepEqual(await ask(client), before);
    const fresh = report.recovery!.snapshot!;
    assert.equal((await store.current('ref'))!.id, fresh.id);
    await suspendEngine(store, 'ref', client);
    const again = await restoreEngine(fresh, client);
    assert.equal(again.path, 'restored');
    assert.equal(await loads(), loaded + 1);
    assert.deepEqual(await ask(client), before);
  });

  it("another model's snapshot is refused with every difference; tokens are checked; suspend without a snapshot is refused", async () => {
    const b = await startEngine({ device: 'cuda', seed: 2, args: MODEL_ARGS });
    const clientB = new EngineClient({ baseUrl: b.url, token: b.token });
    try {
      const snapB = await captureEngine(store, 'other', clientB);
      await suspendEngine(store, 'ref', client);
      await assert.rejects(restoreEngine(snapB, client), (err: VsnapError) => {
        assert.equal(err.code, 'E_MANIFEST_MISMATCH');
        const paths = (err.details.mismatches as Array<{ path: string }>).map((m) => m.path);
        assert.ok(paths.includes('model.id') && paths.includes('model.revision'), paths.join(','));
        return true;
      });
      assert.equal((await client.wire.vsnapStatus()).sleeping, true);
      await restoreEngine((await Snapshot.open(store, 'ref')), client);

      await assert.rejects(new EngineClient({ baseUrl: a.url }).wire.vsnapStatus(), (err: VsnapError) => err.code === 'E_ENGINE_HTTP' && err.details.status === 401);
      await assert.rejects(new EngineClient({ baseUrl: a.url, token: 'wrong' }).wire.vsnapSleep({ level: 2 }), { code: 'E_ENGINE_HTTP' } as never);

      const answer = await ask(clientB);
      await assert.rejects(suspendEngine(store, 'never-captured', clientB), { code: 'E_NOT_RESTORABLE' } as never);
      assert.equal((await clientB.wire.vsnapStatus()).sleeping, false);
      assert.deepEqual(await ask(clientB), answer, 'weights kept');
    } finally {
      await clientB.close();
      await b.stop();
    }
  });
});

describe('GPU: the kinds of weights memory and their load-time cost', async () => {
  const status = await cudaStatus();
  if (!status.available) return;
  // With VSNAP_VLLM_SRC vLLM's own allocator decides (PR #33540: FABRIC, else POSIX-FD): one engine.
  const modes = process.env.VSNAP_VLLM_SRC ? ['vllm'] : ['none', 'fabric-posix', 'fabric'];
  for (const mode of modes) {
    it(`${mode}: load, classify, rehome or not; capture, suspend, restore bit-identical`, async () => {
      const e = await startEngine({ device: 'cuda', seed: 3, args: MODEL_ARGS, ...(mode === 'vllm' ? {} : { env: { VSNAP_REF_HANDLE_TYPES: mode } }) });
      const c = new EngineClient({ baseUrl: e.url, token: e.token });
      const dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-kinds-'));
      try {
        const rank = (await c.wire.vsnapStatus()).ranks[0]!;
        const rehome = (rank as { rehome?: { rehomed: number; secondsByKind: Record<string, number>; seconds: number } }).rehome!;
        const kinds = Object.entries(rank.weightsMemory ?? {}).map(([k, n]) => `${n} ${k}`).join(', ');
        const perKind = Object.entries(rehome.secondsByKind).map(([k, v]) => `${k} ${(v * 1000).toFixed(1)} ms`).join(', ');
        console.log(`memory ${mode}: engine load ${e.loadSeconds.toFixed(2)} s; ${rank.regions} regions (${(rank.bytes / GiB).toFixed(2)} GiB): ${kinds}; bridge at load ${(rehome.seconds * 1000).toFixed(1)} ms (${perKind}), ${rehome.rehomed} rehomed`);
        if (mode === 'none') assert.deepEqual(rank.weightsMemory, { none: rank.regions });
        // POSIX-FD memory is exported as it is: only other kinds are rehomed
        assert.equal(rehome.rehomed, rank.regions - (rank.weightsMemory?.['posix-fd'] ?? 0));
        const before = await ask(c);
        const store = await RegionStore.open(dir);
        const snap = await captureEngine(store, 'kinds', c);
        await suspendEngine(store, 'kinds', c);
        await restoreEngine(snap, c);
        assert.deepEqual(await ask(c), before);
      } finally {
        await c.close();
        await e.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});
