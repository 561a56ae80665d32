// GPU suite, soak (device only): 200 suspend/restore cycles of the reference engine on CUDA, through
// the store, the RAM tier and tier 0 in turn, every answer checked against the one before the first
// suspend; GPU memory (nvidia-smi), pinned memory, RSS and open descriptors must stay flat. Prints
// the figures. VSNAP_SOAK_CYCLES changes the count.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cudaStatus, EngineClient, RamTier, RegionStore, GpuTier, restoreEngine, suspendEngine } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { stagingPools } from '../../src/transfer/staging.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { gpuMemoryOf, gpuUsedMiB } from './nvidia-smi.js';

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const CYCLES = Number(process.env.VSNAP_SOAK_CYCLES ?? 200);
const MODEL_ARGS = ['--layers', '18', '--hidden', '2048'];

function openFds(): string[] {
  const out: string[] = [];
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const target = readlinkSync(`/proc/self/fd/${fd}`);
      if (!target.startsWith('socket:')) out.push(target);
    } catch {
      // the directory's own descriptor
    }
  }
  return out.sort();
}

function status(field: string): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

interface Sample {
  cycle: number;
  gpuUsedMiB: number;
  engineMiB: number | null;
  pinnedBytes: number;
  rssBytes: number;
  fds: string[];
}

describe('GPU: soak of the reference engine', async () => {
  const cuda = await cudaStatus();
  if (!cuda.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${cuda.reason}`));
    return;
  }
  let engine: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let cache: RamTier;
  let resident: GpuTier;
  let dir: string;

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-soak-'));
    store = await RegionStore.open(dir);
    engine = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS });
    client = new EngineClient({ baseUrl: engine.url, token: engine.token });
    cache = await RamTier.create({ budgetBytes: 3 * GiB });
    resident = new GpuTier();
  });

  after(async () => {
    resident?.close();
    cache?.close();
    await client?.close();
    await engine?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it(`${CYCLES} suspend/restore cycles (store, RAM tier, tier 0 in turn): every answer identical, memory and descriptors flat`, async () => {
    const expected = await askCapital(client, 16);
    const tiers = ['store', 'ram', 'gpu'] as const;
    const seconds: Record<string, number[]> = { store: [], ram: [], gpu: [] };
    const cycle = async (i: number): Promise<void> => {
      const tier = tiers[i % 3]!;
      const { snapshot } = await suspendEngine(store, 'soak', client, { captureIfNeeded: true, ...(tier === 'gpu' ? { tiers: { gpu: resident } } : {}) });
      const report = await restoreEngine(snapshot, client, { tiers: { ...(tier === 'ram' ? { ram: cache } : {}), ...(tier === 'gpu' ? { gpu: resident } : {}) } });
      if (i >= 3) assert.equal(report.tier, tier, `cycle ${i}`);
      seconds[tier]!.push(report.seconds);
      assert.deepEqual(await askCapital(client, 16), expected, `cycle ${i}: the answer changed`);
    };
    const sample = (i: number): Sample => ({
      cycle: i,
      gpuUsedMiB: gpuUsedMiB(),
      engineMiB: gpuMemoryOf(engine.process.pid!),
      pinnedBytes: stagingPools.pinnedBytes() + (cache.pinned ? cache.budgetBytes : 0),
      rssBytes: status('VmRSS'),
      fds: openFds(),
    });
    const warmup = 6;
    for (let i = 0; i < warmup; i++) await cycle(i);
    const samples: Sample[] = [sample(warmup - 1)];
    for (let i = warmup; i < warmup + CYCLES; i++) {
      await cycle(i);
      if (i % 30 === 29 || i === warmup + CYCLES - 1) {
        global.gc?.();
        samples.push(sample(i));
        const s = samples.at(-1)!;
        console.log(
          `cycle ${i}: GPU used ${s.gpuUsedMiB} MiB (engine ${s.engineMiB} MiB), pinned ${(s.pinnedBytes / MiB).toFixed(0)} MiB, RSS ${(s.rssBytes / MiB).toFixed(0)} MiB, ${s.fds.length} descriptors`,
        );
      }
    }
    const first = samples[0]!;
    const last = samples.at(-1)!;
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]! * 1000;
    console.log(
      `soak: ${CYCLES} cycles, every answer identical; restore median store ${median(seconds.store!).toFixed(0)} ms, ram ${median(seconds.ram!).toFixed(0)} ms, ` +
        `tier 0 ${median(seconds.gpu!).toFixed(0)} ms; GPU used ${first.gpuUsedMiB} -> ${last.gpuUsedMiB} MiB, engine ${first.engineMiB} -> ${last.engineMiB} MiB, ` +
        `pinned ${(first.pinnedBytes / MiB).toFixed(0)} -> ${(last.pinnedBytes / MiB).toFixed(0)} MiB, RSS ${(first.rssBytes / MiB).toFixed(0)} -> ${(last.rssBytes / MiB).toFixed(0)} MiB, ` +
        `descriptors ${first.fds.length} -> ${last.fds.length}`,
    );
    assert.deepEqual(resident.entries(), [], 'tier 0 holds nothing while the engine is awake');
    assert.deepEqual(last.fds, first.fds, 'open descriptors');
    assert.equal(last.pinnedBytes, first.pinnedBytes, 'pinned memory');
    // One leaked region per cycle would be GiBs by now; allow allocator noise only.
    assert.ok(last.gpuUsedMiB - first.gpuUsedMiB <= 256, `GPU memory grew ${last.gpuUsedMiB - first.gpuUsedMiB} MiB`);
    if (first.engineMiB !== null && last.engineMiB !== null) assert.ok(last.engineMiB - first.engineMiB <= 256, `the engine's GPU memory grew ${last.engineMiB - first.engineMiB} MiB`);
    assert.ok(last.rssBytes - first.rssBytes <= 256 * MiB, `RSS grew ${((last.rssBytes - first.rssBytes) / MiB).toFixed(0)} MiB`);
  });
});
