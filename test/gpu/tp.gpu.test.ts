// GPU suite, tensor parallel (device only, two GPUs): the reference engine with
// --tensor-parallel-size 2 (one worker process per rank, rank r on GPU r, each its own shard),
// captured, suspended (level 2) and restored with both ranks moving at once; the answer bit
// for bit; the aggregate restore bandwidth against both GPUs' raw H2D measured together in the
// same run (bench/ceiling.cu, built by test/gpu/run.sh); deep suspend of both ranks with each
// rank's GPU memory before and after. Parseable lines: `TP2_RESULT {json}`, `TP2_DEEP {json}`.
// Each restore also prints every rank's share (`TP2 restore N per rank: ...`): its GPU, bytes,
// the seconds until its last byte landed and its digest check's seconds (the ranks move and are
// checked at the same time, each GPU by its own context and stream).
// Size: VSNAP_GPU_TP_LAYERS (default 16 layers of width 4096: about 6 GiB a rank).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { captureEngine, cudaStatus, EngineClient, RamTier, RegionStore, restoreEngine, suspendEngine, type Snapshot } from '../../src/index.js';
import { listDevices, releaseIdleResources } from '../../src/plumbing.js';
import { nativeCheckpointBackend } from '../../src/flows/deep.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { gpuMemoryOf, gpuUsedPerGpuMiB } from './nvidia-smi.js';

const GiB = 2 ** 30;
const LAYERS = process.env.VSNAP_GPU_TP_LAYERS ?? '16';
const MODEL_ARGS = ['--layers', LAYERS, '--hidden', '4096'];
const ROUNDS = 3;
const gbps = (bytes: number, seconds: number): number => +(bytes / seconds / 1e9).toFixed(2);
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

async function skipReason(): Promise<string | undefined> {
  const status = await cudaStatus();
  if (!status.available) return `needs NVIDIA GPUs: ${status.reason}`;
  const gpus = await listDevices();
  if (gpus.length < 2) return `needs 2 GPUs, ${gpus.length} visible (run it on the two-GPU kind)`;
  return undefined;
}

describe('GPU: tensor parallel size 2 (one worker process per GPU)', async () => {
  const skip = await skipReason();
  if (skip) {
    it('TP=2 capture, suspend, restore, deep suspend', { skip }, () => undefined);
    return;
  }
  let engine: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let cache: RamTier;
  let dir: string;
  let snap: Snapshot;
  let expected: Awaited<ReturnType<typeof askCapital>>;
  let pids: number[];

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-tp-'));
    store = await RegionStore.open(dir);
    engine = await startEngine({ device: 'cuda', seed: 1, tensorParallelSize: 2, args: MODEL_ARGS, startTimeoutMs: 300_000 });
    client = new EngineClient({ baseUrl: engine.url, token: engine.token });
  });

  after(async () => {
    cache?.close();
    await client?.close();
    await engine?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it('capture, level-2 suspend and restore of both ranks at once: bit-identical; aggregate bandwidth vs raw H2D of both GPUs', async () => {
    const status = await client.wire.vsnapStatus();
    pids = status.ranks.map((r) => r.pid);
    assert.deepEqual(pids, engine.workerPids);
    const gpus = await listDevices();
    assert.deepEqual(
      status.ranks.map((r) => gpus.find((g) => g.uuid === r.device.uuid)?.ordinal),
      [0, 1],
      'rank r runs on GPU r',
    );
    expected = await askCapital(client, 16);
    const bytes = status.ranks.reduce((n, r) => n + r.bytes, 0);
    cache = await RamTier.create({ budgetBytes: bytes + GiB });
    const awakeMiB = pids.map(gpuMemoryOf);
    const c0 = performance.now();
    snap = await captureEngine(store, 'tp', client, { ram: cache });
    const captureSeconds = (performance.now() - c0) / 1000;
    assert.equal(snap.manifest.data.ranks.length, 2);
    assert.equal(snap.manifest.data.model?.tensorParallelSize, 2);

    const s = await suspendEngine(store, 'tp', client);
    const level2MiB = pids.map(gpuMemoryOf);
    for (let r = 0; r < 2; r++) assert.ok(awakeMiB[r]! - level2MiB[r]! >= 2 * 1024, `rank ${r}: sleep must free its weights (${awakeMiB[r]} -> ${level2MiB[r]} MiB)`);

    const restores: number[] = [];
    const totals: number[] = [];
    const perRank: Array<Array<{ rank: number; device: number; GiB: number; hydrateMs: number; hydrateGBps: number; digestMs?: number }>> = [];
    for (let round = 1; round <= ROUNDS; round++) {
      const report = await restoreEngine(snap, client, { tiers: { ram: cache } });
      assert.equal(report.tier, 'ram');
      assert.equal(report.bytes, snap.manifest.totalBytes);
      assert.deepEqual(await askCapital(client, 16), expected, `round ${round}: token ids and logprobs bit for bit`);
      restores.push(gbps(report.bytes, report.phases.hydrate!));
      totals.push(report.seconds);
      console.log(`TP2 restore ${round}: ${Object.entries(report.phases).map(([k, v]) => `${k} ${(v * 1000).toFixed(1)} ms`).join(', ')}`);
      // every rank's bytes were copied on its own GPU (the device of its mapping): rank r on GPU r
      assert.deepEqual(
        report.devices?.map((d) => [d.device, d.bytes]),
        status.ranks.map((r, i) => [i, r.bytes]),
        'one share per GPU, each holding exactly its rank\'s bytes',
      );
      const shares = report.devices!.map((d) => ({
        rank: d.device,
        device: d.device,
        GiB: +(d.bytes / GiB).toFixed(2),
        hydrateMs: +(d.hydrateSeconds * 1000).toFixed(1),
        hydrateGBps: gbps(d.bytes, d.hydrateSeconds),
        ...(d.digestSeconds !== undefined ? { digestMs: +(d.digestSeconds * 1000).toFixed(1) } : {}),
      }));
      perRank.push(shares);
      console.log(`TP2 restore ${round} per rank: ${shares.map((x) => `rank ${x.rank} (GPU ${x.device}, ${x.GiB} GiB): hydrate ${x.hydrateMs} ms = ${x.hydrateGBps} GB/s, digest ${x.digestMs ?? '-'} ms`).join('; ')}`);
      await suspendEngine(store, 'tp', client);
    }

    // The ceiling, now (same run, engine asleep): raw cudaMemcpy H2D of the same region sizes,
    // rank r's regions on GPU r, both GPUs at once.
    const ceilingBin = process.env.VSNAP_GPU_CEILING;
    assert.ok(ceilingBin && existsSync(ceilingBin), 'VSNAP_GPU_CEILING (bench/ceiling.cu built by test/gpu/run.sh with nvcc) is needed for the ceiling');
    const [r0, r1] = snap.manifest.data.ranks.map((r) => r.regions.map((x) => x.size));
    const sizes: number[] = [];
    for (let i = 0; i < Math.max(r0!.length, r1!.length); i++) sizes.push(...(i < r0!.length ? [r0![i]!] : []), ...(i < r1!.length ? [r1![i]!] : []));
    assert.equal(r0!.length, r1!.length, 'both shards have the same layout, so region i of the interleaved list lands on GPU i % 2');
    const ceiling = JSON.parse(execFileSync(ceilingBin, [String(ROUNDS), '--devices', '2', ...sizes.map(String)], { encoding: 'utf8' })) as {
      h2dGBps: { max: number; median: number };
    };
    const best = Math.max(...restores);
    const result = {
      ranks: 2,
      bytes,
      bytesPerRank: status.ranks.map((r) => r.bytes),
      regionsPerRank: status.ranks.map((r) => r.regions),
      captureSeconds: +captureSeconds.toFixed(3),
      suspendSeconds: +s.seconds.toFixed(3),
      restoreHydrateGBps: { best, median: median(restores), all: restores },
      restoreTotalSeconds: { best: +Math.min(...totals).toFixed(3), median: +median(totals).toFixed(3) },
      perRank,
      ceilingH2dBothGpusGBps: ceiling.h2dGBps,
      ratioToCeiling: +(best / ceiling.h2dGBps.max).toFixed(3),
      gpuMemoryMiB: { awake: awakeMiB, level2: level2MiB },
    };
    console.log(`TP2_RESULT ${JSON.stringify(result)}`);
  });

  it('deep suspend of both ranks: ~0 MiB per rank, the status answers, restored bit-identical; GPU memory per rank before and after', async () => {
    assert.ok(snap, 'needs the capture of the first test');
    const backend = nativeCheckpointBackend();
    // the engine is asleep (level 2) after the first test: wake it, then suspend deep from awake
    await restoreEngine(snap, client, { tiers: { ram: cache } });
    const awakeMiB = pids.map(gpuMemoryOf);
    const plain = await suspendEngine(store, 'tp', client);
    const level2MiB = pids.map(gpuMemoryOf);
    const level2Used = gpuUsedPerGpuMiB();
    await restoreEngine(snap, client, { tiers: { ram: cache } });
    const rounds = [];
    for (let round = 1; round <= 2; round++) {
      const s = await suspendEngine(store, 'tp', client, { deep: true });
      const deepMiB = pids.map(gpuMemoryOf);
      const deepUsed = gpuUsedPerGpuMiB();
      for (const pid of pids) assert.equal(await backend.state(pid), 'checkpointed');
      deepMiB.forEach((m, r) => assert.ok(m === null || m === 0, `rank ${r} still holds ${m} MiB after deep suspend`));
      assert.equal((await client.wire.vsnapStatus()).sleeping, true); // the status answers while both are checkpointed
      const r = await restoreEngine(snap, client, { tiers: { ram: cache } });
      for (const pid of pids) assert.equal(await backend.state(pid), 'running');
      assert.deepEqual(await askCapital(client, 16), expected, 'bit for bit after a deep round trip of both ranks');
      rounds.push({
        round,
        deepMiB: deepMiB.map((m) => m ?? 0),
        gpuUsedMiB: { level2: level2Used, deep: deepUsed },
        suspend: { sleep: s.phases.sleep, lock: s.phases['deep.lock'], checkpoint: s.phases['deep.checkpoint'] },
        restore: { restore: r.phases['deep.restore'], unlock: r.phases['deep.unlock'], hydrate: r.phases.hydrate, total: r.seconds },
      });
    }
    console.log(`TP2_DEEP ${JSON.stringify({ awakeMiB, level2MiB, plainSleepSeconds: plain.phases.sleep, rounds })}`);
  });
});
