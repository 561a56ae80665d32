import { describe, expect, it } from 'vitest';

import { overlapTable, targetsTable } from '../../bench/swap-report.js';

describe('bench: the overlap rows (engine-swap --overlap)', () => {
  const row = (overlap: string, swapMedian: number) => ({ row: 'RAM tier', overlap, swapMedian, suspendMedian: 0.2, restoreMedian: 0.4, wakeKvCache: 0.05, awaitRoom: overlap === 'weights' ? 0.1 : null });

  it('one line per mode, each against the same tier without overlap', () => {
    const t = overlapTable([row('none', 0.8), row('weights', 0.6), row('all', 0.4)]);
    expect(t).toContain('| RAM tier | none | 800.0 | 1.000x |');
    expect(t).toContain('| RAM tier | weights | 600.0 | 0.750x | 200.0 | 400.0 | 50.0 | 100.0 |');
    expect(t).toContain('| RAM tier | all | 400.0 | 0.500x |');
  });

  it('nothing without an overlapped mode; n/a without the serial row', () => {
    expect(overlapTable([row('none', 0.8)])).toBe('');
    expect(overlapTable([row('all', 0.4)])).toContain('| RAM tier | all | 400.0 | n/a |');
  });

  it('the targets list each overlapped swap against its tier target', () => {
    const t = targetsTable({ ramHydrateGBps: null, h2dCeiling: null, engineBytes: 17 * 2 ** 30, sweep: null, capture2: null, vllm: null, overlapped: [{ row: 'ram', overlap: 'weights', swapMedian: 0.45 }, { row: 'tier0', overlap: 'all', swapMedian: 0.2 }] });
    expect(t).toContain('| RAM-tier swap incl. the check <= 0.5 s median, overlap weights | 0.450 s | met |');
    expect(t).toContain('| tier-0 swap incl. the check <= 0.1 s median, overlap all | 0.200 s | not met |');
  });

  it("the engine's own tier 0 gets a target line of its own", () => {
    const engine = { label: 'engine', swapMedian: 0.09, suspendMedian: 0.04, restoreMedian: 0.05, suspendPhases: {}, restorePhases: {} };
    const t = targetsTable({ ramHydrateGBps: null, h2dCeiling: null, engineBytes: 17 * 2 ** 30, sweep: null, capture2: null, vllm: null, engine });
    expect(t).toContain("| tier-0 swap incl. the check <= 0.1 s median, the engine's own tier 0 (KV cache released, weights kept in the engine) | 0.090 s | met |");
  });
});
