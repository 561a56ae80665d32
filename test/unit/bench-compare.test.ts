// Two runs of the swap bench compared median by median (bench/compare.ts): what the lead's
// same-call comparison of two trees reads. Synthetic runs; no GPU.
import { describe, expect, it } from 'vitest';

import { compareRuns, type SwapRun } from '../../bench/compare.js';
import type { SweepRow } from '../../bench/swap-report.js';

const stats = (median: number) => ({ n: 5, min: median, median, max: median });
const run = (swap: number, hydrate: number, viaFds: number, wake: number): SwapRun => ({
  rows: [
    { label: 'RAM tier (hot, pinned RamTier)', summary: { swapSeconds: stats(swap), suspendSeconds: stats(0.044), restoreSeconds: stats(0.384), phasesMedian: { hydrate, expectedResponse: 0.022 } } },
    { label: 'tier 0 (weights kept on the GPU)', summary: null },
  ],
  sweep: { rows: [{ regions: 4000, restoreMedianSeconds: 0.33, imported: { restoreMedianSeconds: viaFds } } as SweepRow] },
  vllmLevel1: { summary: { wakeMedianSeconds: wake } },
});

describe('bench compare: two swap runs, median by median', () => {
  it('lists every median both runs hold with its ratio, and marks those more than 3% slower', () => {
    const { table, slower } = compareRuns(run(0.427, 0.35, 0.338, 0.348), run(0.44, 0.351, 0.3, 0.5));
    expect(table).toContain('| RAM tier (hot, pinned RamTier): swap | 427.0 | 440.0 | 1.030x (more than 3% slower) |'); // 3.04%
    expect(slower).toEqual(['RAM tier (hot, pinned RamTier): swap']);
    expect(table).toContain('| RAM tier (hot, pinned RamTier): restore without the check | 362.0 | 362.0 | 1.000x |');
    expect(table).toContain('| sweep, 4000 regions: restore via fds | 338.0 | 300.0 | 0.888x |');
    expect(table).toContain("| vLLM's level-1 wake (reference) | 348.0 | 500.0 | 1.437x |"); // a reference: never marked
    expect(table).not.toContain('tier 0'); // no summary: nothing to compare
    expect(table).toMatch(/1 median\(s\) more than 3% slower: RAM tier \(hot, pinned RamTier\): swap$/);
  });

  it('names the rows measured in one run only (a row renamed between the trees), not silently dropped', () => {
    const before = run(0.4, 0.35, 0.3, 0.3);
    const renamed = { ...before, rows: [{ ...before.rows[0]!, label: 'RAM tier (hot, pinned HostCache)' }, before.rows[1]!] };
    const { table } = compareRuns(renamed, before);
    expect(table).toContain('not compared, measured in one run only: RAM tier (hot, pinned HostCache) (before only); RAM tier (hot, pinned RamTier) (after only)');
    expect(compareRuns(before, before).table).not.toContain('not compared');
  });

  it('says so when nothing is slower, and takes another tolerance', () => {
    expect(compareRuns(run(0.4, 0.35, 0.3, 0.3), run(0.4, 0.35, 0.3, 0.3)).table).toMatch(/no median more than 3% slower$/);
    expect(compareRuns(run(0.4, 0.35, 0.3, 0.3), run(0.41, 0.35, 0.3, 0.3), 0.01).slower).toHaveLength(1);
  });
});
