import { describe, expect, it } from 'vitest';

import { demoSizes } from '../../src/cli/demo.js';
import { formatBytes } from '../../src/cli/output.js';

const MiB = 1024 * 1024;

describe('the demo\'s region sizes', () => {
  it.each([
    [1024 * MiB, 2 * MiB, '1.00 GiB'],
    [1024 * MiB, 4096, '1.00 GiB'],
    [24 * MiB, 4096, '24.00 MiB'],
    [25 * MiB, 2 * MiB, '24.00 MiB'], // whole granules only
    [3 * MiB, 2 * MiB, '10.00 MiB'], // at least a granule a region
  ])('%d bytes in granules of %d: add up to what was asked (%s), each a whole number of granules', (total, granule, shown) => {
    const sizes = demoSizes(total, granule);
    expect(sizes).toHaveLength(5);
    for (const s of sizes) expect(s % granule).toBe(0);
    for (const s of sizes) expect(s).toBeGreaterThan(0);
    expect(formatBytes(sizes.reduce((a, b) => a + b, 0))).toBe(shown);
  });
});
