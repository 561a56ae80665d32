import type { CallOptions } from './types.js';
import type { EngineControl } from './control.js';
import { readTables, type RegionTables } from './region-table.js';

/**
 * Every rank's weights region table, read from the engine (asleep or awake), without descriptors:
 * what a restore checks against the snapshot and fills new memory for before the wake.
 * @internal
 */
export async function describeRegions(control: EngineControl, rankCount: number, call?: CallOptions): Promise<RegionTables> {
  return { ranks: await readTables(await control.describe(call), rankCount) };
}
