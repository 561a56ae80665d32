import { describe, expect, it } from 'vitest';

import { NeighbourTier } from '../../src/cache/neighbour-tier.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { tempDir } from '../helpers/tmp.js';

const GB = 1e9;

describe('SwapController: the neighbour option', () => {
  it('makes a tier from { device, budgetBytes } and frees it at close; a NeighbourTier passed in stays the caller\'s', async () => {
    const store = await RegionStore.open(tempDir());
    const made = await SwapController.create({ store, engines: [], budgets: { 0: GB }, tiers: { neighbour: { device: 1, budgetBytes: 2 * GB } } });
    expect(made.neighbour()).toEqual({ device: 1, budgetBytes: 2 * GB, usedBytes: 0, entries: [] });
    expect(made.usage()).toEqual({ 0: 0 });
    const internal = made as unknown as { ctx: { neighbour: { tier: NeighbourTier } } };
    expect(internal.ctx.neighbour.tier.closed).toBe(false);
    await made.close();
    expect(internal.ctx.neighbour.tier.closed).toBe(true);
    expect(made.neighbour()).toEqual({ device: 1, budgetBytes: 2 * GB, usedBytes: 0, entries: [] });

    const tier = NeighbourTier.create({ device: 2, budgetBytes: GB });
    const given = await SwapController.create({ store, engines: [], budgets: { 0: GB }, tiers: { neighbour: tier } });
    await given.close();
    expect(tier.closed).toBe(false);
    tier.close();

    const none = await SwapController.create({ store, engines: [], budgets: { 0: GB } });
    expect(none.neighbour()).toBeUndefined();
    await none.close();
    await expect(SwapController.create({ store, engines: [], budgets: { 0: GB }, tiers: { neighbour: { device: 1, budgetBytes: 0 } } })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});
