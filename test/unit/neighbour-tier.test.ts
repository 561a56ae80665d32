import { describe, expect, it } from 'vitest';

import { NeighbourTier } from '../../src/gpu/neighbour-tier.js';
import { HostRegion } from '../../src/regions/host-region.js';

// The neighbour tier's checks that need no GPU (test/gpu/neighbour.gpu.test.ts runs the copies).
describe('NeighbourTier without GPUs', () => {
  it('checks its options', () => {
    expect(() => NeighbourTier.create({ device: -1, budgetBytes: 1 })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
    expect(() => NeighbourTier.create({ device: 1, budgetBytes: 0 })).toThrow(expect.objectContaining({ code: 'E_INVALID_ARGUMENT' }));
  });

  it('parks only GPU memory on another GPU; an unknown id is not found; a closed tier refuses', async () => {
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 1 << 30 });
    const host = HostRegion.create(4096, 'r');
    try {
      await expect(tier.park('m', [{ key: 'r', size: 4096, memory: host.memory }])).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
      await expect(tier.park('m', [{ key: 'r', size: 4096, memory: { kind: 'imported', fd: host.fd, device: 1 } }])).rejects.toMatchObject({
        code: 'E_INVALID_ARGUMENT',
        message: expect.stringMatching(/other than the tier's/),
      });
      expect(tier.usedBytes).toBe(0);
      await expect(tier.restore('m', [])).rejects.toMatchObject({ code: 'E_SNAPSHOT_NOT_FOUND' });
      expect(tier.evict('m')).toBe(false);
      tier.close();
      expect(tier.closed).toBe(true);
      await expect(tier.park('m', [])).rejects.toMatchObject({ code: 'E_CLOSED' });
    } finally {
      host.close();
    }
  });
});
