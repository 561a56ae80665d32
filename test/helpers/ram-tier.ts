import { RamTier } from '../../src/cache/ram-tier.js';
import type { HostRegion } from '../../src/regions/host-region.js';
import { fillRegion, holdsPattern, patternedRegions } from './regions.js';

const MiB = 1024 * 1024;
/** Region sizes of the RAM-tier capture tests: a large odd one, a small one, an empty one. */
export const RAM_TIER_SIZES = { a: 3 * MiB + 5, b: MiB, c: 0 };

/**
 * Patterned host regions to capture, zeroed ones to restore into, and unpinned RAM tiers, each
 * registered in `cleanup` (closed by the test file's afterEach).
 */
export function ramTierFixtures(cleanup: Array<{ close(): void }>) {
  const sources = (sizes: Record<string, number> = RAM_TIER_SIZES) => {
    const regions = patternedRegions(sizes);
    for (const r of regions.values()) cleanup.push(r);
    return [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
  };
  const targets = (sizes: Record<string, number> = RAM_TIER_SIZES) => {
    const t = patternedRegions(sizes);
    for (const r of t.values()) {
      cleanup.push(r);
      fillRegion(r, 0);
    }
    return t;
  };
  const asTargets = (t: Map<string, HostRegion>) => [...t].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
  const intact = (t: Map<string, HostRegion>) => [...t].every(([key, r]) => holdsPattern(r, key));
  const cacheOf = async (budgetBytes: number): Promise<RamTier> => {
    const cache = await RamTier.create({ budgetBytes, pin: false });
    cleanup.push(cache);
    return cache;
  };
  return { sources, targets, asTargets, intact, cacheOf };
}
