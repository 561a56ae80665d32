import { describe, expect, it } from 'vitest';

import { overlapTable } from '../../bench/swap-report.js';

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
});
