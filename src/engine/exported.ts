import { MappedRegions, type MappedRegionsOptions } from '../regions/mapped.js';
import type { LiveRegionRef } from '../digest/compare.js';
import type { ExportedRegions } from './export.js';

/**
 * The exported regions of an engine as live regions (rank by rank, in the order sent), through
 * `mapped` (opened from this same list) when given, so nothing maps them again. @internal
 */
export function liveRefs(exported: ExportedRegions, mapped?: MappedRegions): LiveRegionRef[] {
  let i = 0;
  return exported.ranks.flatMap((r) => r.regions.map((x) => ({ rank: x.rank, key: x.key, size: x.size, memory: mapped ? mapped.memory(i++) : x.memory })));
}

/** Maps every exported region once, for all the operations of one flow. @internal */
export async function mapExported(exported: ExportedRegions, options: MappedRegionsOptions = {}): Promise<MappedRegions> {
  return MappedRegions.open(liveRefs(exported), options);
}

