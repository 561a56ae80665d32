// The CPU parts of `npm run bench -- swap`: the sweep's region layouts and its RAM-tier restores on
// host memory, the host-memory probes of the vLLM row, and when the engine's own tier 0 can run. No
// timing is asserted: only that every part runs and reports what it measured.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, describe, expect, it, vi } from 'vitest';

import { dropCaches } from '../../bench/common.js';
import { engineTierUnsupported } from '../../bench/engine.js';
import { sweepTable } from '../../bench/swap-report.js';
import { runCeiling, runSweep, splitEvenly } from '../../bench/swap-sweep.js';
import { gpuBytesOf, hostMemory } from '../../bench/swap-vllm.js';
import { RegionStore } from '../../src/index.js';

const MiB = 1024 * 1024;
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'vsnap-bench-swap-'));
  dirs.push(d);
  return d;
};
describe('bench swap: region layouts', () => {
  it('splits the same bytes into near-equal granule multiples', () => {
    for (const n of [36, 252, 1000, 4000]) {
      const sizes = splitEvenly(16 * 1024 * MiB, n, 2 * MiB);
      expect(sizes).toHaveLength(n);
      expect(sizes.reduce((a, b) => a + b, 0)).toBe(16 * 1024 * MiB); // 8192 granules: none lost
      expect(sizes.every((s) => s % (2 * MiB) === 0)).toBe(true);
      expect(Math.max(...sizes) - Math.min(...sizes)).toBeLessThanOrEqual(2 * MiB);
    }
  });
  it('refuses a split into regions smaller than a granule', () => {
    expect(() => splitEvenly(8 * MiB, 5, 2 * MiB)).toThrow(/cannot split/);
    expect(() => splitEvenly(8 * MiB, 0, 2 * MiB)).toThrow(/cannot split/);
  });
});

describe('bench swap: the region-count sweep on host memory', () => {
  it('captures each layout into the RAM tier and restores it from there', async () => {
    const store = await RegionStore.open(tmp());
    const logs: string[] = [];
    const out = await runSweep({ device: 'host', totalBytes: 4 * MiB, counts: [4, 64], reps: 1, ceilingBin: null, store, log: (m) => logs.push(m) });
    expect(out.rows.map((r) => r.regions)).toEqual([4, 64]);
    for (const r of out.rows) {
      expect(r.bytes).toBe(4 * MiB);
      expect(r.restoreSeconds).toHaveLength(1);
      expect(r.restoreMedianSeconds).toBeGreaterThan(0);
      expect(r.ceiling).toBeNull();
      expect(r.vsCeiling).toBeNull();
    }
    expect(out.rows[0]!.vsFirst).toBe(1);
    expect(out.rows[1]!.vsFirst).toBeCloseTo(out.rows[1]!.restoreMedianSeconds / out.rows[0]!.restoreMedianSeconds, 9);
    expect(out.ceilingNote).toMatch(/no ceiling binary/);
    expect(logs.some((l) => l.includes('64 regions'))).toBe(true);
    const table = sweepTable(out.rows, 'host', out.ceilingNote);
    expect(table).toContain('| 64 |');
    // the worst ratio of this run, whatever it is (a loaded host can make it 10x or more)
    expect(table).toContain(`worst ${Math.max(...out.rows.map((r) => r.vsFirst ?? 0)).toFixed(3)}x`);
  });
  it('has no ceiling without the binary', () => {
    expect(runCeiling(null, [MiB], 1)).toBeNull();
    expect(runCeiling('/nonexistent/ceiling', [MiB], 1)).toBeNull();
  });
});

describe("bench swap: the vLLM row's memory probes", () => {
  it('reads the host memory of a process and no GPU memory without nvidia-smi', () => {
    const m = hostMemory(process.pid);
    expect(m.memAvailableBytes).toBeGreaterThan(0);
    expect(m.process.VmRSS).toBeGreaterThan(0);
    expect(hostMemory(2 ** 30).process).toEqual({}); // no such process
    expect(gpuBytesOf(process.pid)).toBeNull();
  });
});

describe("bench swap: the engine's own tier 0 on vLLM's allocator code", () => {
  // The `engine` row (and the tier-0 GPU test) report an allocator without discard(tags) as a
  // reason to skip, instead of failing in the middle of the bench (vLLM main's cumem.py at 010c2112 has none).
  const layout = (layout: 'old' | 'new', source: string): string => {
    const root = tmp();
    const dir = layout === 'old' ? join(root, 'vllm', 'device_allocator') : join(root, 'vllm', 'backends', 'platform', 'device_allocator');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'cumem.py'), source);
    return root;
  };
  it('names the allocator file when it has no discard, in either layout', () => {
    for (const l of ['old', 'new'] as const) {
      const src = layout(l, 'class CuMemAllocator:\n    def sleep(self, offload_tags=None):\n        pass\n');
      const reason = engineTierUnsupported(src);
      expect(reason).toMatch(/has no discard\(tags\)/);
      expect(reason).toContain(join(src, 'vllm'));
    }
  });
  it('lets the row run on an allocator with discard, and without VSNAP_VLLM_SRC (the stand-in has it)', () => {
    expect(engineTierUnsupported(layout('old', 'class CuMemAllocator:\n    def discard(self, tags):\n        pass\n'))).toBeUndefined();
    expect(engineTierUnsupported('')).toBeUndefined();
    expect(engineTierUnsupported(tmp())).toBeUndefined(); // a folder without the allocator: nothing to say about it
  });
});

describe('bench: the page-cache drop', () => {
  it('drops nothing under `vsnap bench` without --drop-caches, and says so (the cold row skips with it)', () => {
    vi.stubEnv('VSNAP_BENCH_DROP_CACHES', '0');
    try {
      expect(dropCaches()).toMatch(/without --drop-caches/);
    } finally {
      vi.unstubAllEnvs();
    }
  });
});
