import { changedChunks, digestRegions, type DigestResult, type DigestTarget } from '../digest/index.js';
import type { ResidentEntry } from '../cache/resident-weights.js';
import type { ExportedRegions } from '../engine/export.js';
import { VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import { MappedRegions, type MappedRegionsOptions } from '../regions/mapped.js';
import type { RegionMemory } from '../regions/memory.js';
import type { RegionStore } from '../store/region-store.js';
import { statSync } from 'node:fs';

// The GPU digest in the snapshot flows: taken at capture (and used to share unchanged regions
// with an earlier capture), compared with the live weights before a suspend discards them, and
// with the restored memory after a hydrate.

/** A live region, by rank and key. @internal */
export interface LiveRegionRef {
  readonly rank: number;
  readonly key: string;
  readonly size: number;
  readonly memory: RegionMemory;
}

/**
 * The dirty check before a discard: whether the live weights still equal the snapshot.
 * @public
 */
export interface LiveCheckReport {
  /** False when the snapshot has no GPU digests (a version-1 capture): nothing was compared, and it counts as stale. */
  readonly checked: boolean;
  /** The regions whose bytes differ from the snapshot, as `rank/key`. */
  readonly changed: readonly string[];
  /** Bytes digested. */
  readonly bytes: number;
  /** Wall time of the digest. */
  readonly seconds: number;
}

const id = (rank: number, key: string): string => `${rank}/${key}`;

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

/**
 * Tier 0: the dirty check on weights held for a suspended engine, before they are released
 * (a demotion). The held descriptors are digested where they live (on the GPU for CUDA memory).
 * @internal
 */
export async function checkResident(manifest: Manifest, entry: ResidentEntry): Promise<LiveCheckReport> {
  const kind = manifest.data.platform.kind === 'cuda' ? 'imported' : 'host';
  const live = entry.ranks.flatMap((r) => r.regions.map((x, i) => ({ rank: r.rank, key: x.key, size: x.size, memory: { kind, fd: r.fds[i]! } as RegionMemory })));
  return checkLive(manifest, live);
}

/** Digests live regions with the chunking of the snapshot's regions (matched by rank and key). */
async function digestAgainst(
  manifest: Manifest,
  live: readonly LiveRegionRef[],
): Promise<{ pairs: Array<{ region: RegionInfo; ref: string; actual: string[] }>; seconds: number; bytes: number; devices: DigestResult['devices'] }> {
  const byId = new Map(live.map((l) => [id(l.rank, l.key), l]));
  const pairs: Array<{ region: RegionInfo; ref: string; target: DigestTarget }> = [];
  for (const { rank, region } of manifest.regions()) {
    const l = byId.get(id(rank, region.key));
    if (l) pairs.push({ region, ref: id(rank, region.key), target: { size: region.size, chunkSize: region.chunkSize, memory: l.memory } });
  }
  const result = await digestRegions(pairs.map((p) => p.target));
  return {
    pairs: pairs.map((p, i) => ({ region: p.region, ref: p.ref, actual: result.digests[i]! })),
    seconds: result.seconds,
    bytes: pairs.reduce((s, p) => s + p.region.size, 0),
    devices: result.devices,
  };
}

/**
 * Digests the live regions and compares them with the snapshot's digests. A snapshot without
 * digests (version 1) is not compared: `checked` is false.
 * @internal
 */
export async function checkLive(manifest: Manifest, live: readonly LiveRegionRef[]): Promise<LiveCheckReport> {
  if ([...manifest.regions()].some(({ region }) => !region.digests)) return { checked: false, changed: [], bytes: 0, seconds: 0 };
  const { pairs, seconds, bytes } = await digestAgainst(manifest, live);
  const changed = pairs.filter((p) => changedChunks(p.region.digests!, p.actual).length > 0).map((p) => p.ref);
  return { checked: true, changed, bytes, seconds };
}

/** E_STALE for a suspend that would discard weights the snapshot does not hold. @internal */
export function staleError(name: string, report: LiveCheckReport): VsnapError {
  const what = report.checked
    ? `the live weights differ from snapshot '${name}' in ${report.changed.length} region(s): ${report.changed.slice(0, 10).join(', ')}${report.changed.length > 10 ? ', ...' : ''}`
    : `snapshot '${name}' has no GPU digests (a version-1 capture), so the live weights cannot be checked against it`;
  return new VsnapError(
    'E_STALE',
    `refusing to suspend: ${what}; discarding them would restore old weights later. ` +
      "Capture again (captureEngine, or leave onStale at its default 'capture'), then suspend.",
    { name, regions: report.changed, checked: report.checked },
  );
}

/**
 * The GPU digests of regions about to be captured, or nulls when they cannot be taken (a
 * warning says why; such a capture counts as stale at the next suspend and is taken again).
 * @internal
 */
export async function captureDigests(regions: ReadonlyArray<{ size: number; memory: RegionMemory }>, chunkSize: number): Promise<Array<string[] | null>> {
  try {
    return (await digestRegions(regions.map((r) => ({ size: r.size, chunkSize, memory: r.memory })))).digests;
  } catch (err) {
    process.emitWarning(`GPU digests could not be taken (${(err as Error).message}); the capture is recorded without them`, { code: 'VSNAP_DIGEST' });
    return regions.map(() => null);
  }
}

/**
 * Incremental capture: the regions (by index) whose live digests equal those of the same
 * region (rank, key, size, chunk size) in `base`, and whose blob the store still holds. Those
 * are not read again: the new manifest shares the base's blob and checksums.
 * @internal
 */
export function reusableRegions(
  store: RegionStore,
  base: Manifest | undefined,
  regions: ReadonlyArray<{ rank?: number; key: string; size: number }>,
  chunkSize: number,
  gpuDigests: ReadonlyArray<readonly string[] | null>,
): Map<number, RegionInfo> {
  const reused = new Map<number, RegionInfo>();
  if (!base) return reused;
  const prior = new Map([...base.regions()].map(({ rank, region }) => [id(rank, region.key), region]));
  regions.forEach((r, i) => {
    const p = prior.get(id(r.rank ?? 0, r.key));
    const live = gpuDigests[i];
    if (!p?.digests || !live || p.size !== r.size || p.chunkSize !== chunkSize || changedChunks(p.digests, live).length) return;
    try {
      if (statSync(store.blobPath(p.blob)).size === p.size) reused.set(i, p);
    } catch {
      // the blob is gone: read the region again
    }
  });
  return reused;
}

/**
 * Verification after a restore: digests the restored memory (on the GPU for device memory) and
 * compares it with the snapshot. Skipped when the snapshot has no digests or `enabled` is false;
 * returns the seconds it took, or undefined when skipped. Throws E_DIGEST_MISMATCH.
 * @internal
 */
export async function verifyRestored(manifest: Manifest, live: readonly LiveRegionRef[], enabled = true): Promise<number | undefined> {
  return (await verifyRestoredByDevice(manifest, live, enabled))?.seconds;
}

/**
 * {@link verifyRestored}, with each GPU's share: the bytes it digested and the wall time of its
 * batch (the GPUs digest concurrently, each on its own context and stream).
 * @internal
 */
export async function verifyRestoredByDevice(
  manifest: Manifest,
  live: readonly LiveRegionRef[],
  enabled = true,
): Promise<{ seconds: number; devices: DigestResult['devices'] } | undefined> {
  if (!enabled || [...manifest.regions()].some(({ region }) => !region.digests)) return undefined;
  const { pairs, seconds, devices } = await digestAgainst(manifest, live);
  const bad = pairs.map((p) => ({ region: p.ref, chunks: changedChunks(p.region.digests!, p.actual) })).filter((b) => b.chunks.length);
  if (bad.length) {
    throw new VsnapError(
      'E_DIGEST_MISMATCH',
      `after restoring '${manifest.name}' (${manifest.id}) the memory of ${bad.length} region(s) does not match the snapshot's GPU digests ` +
        `(${bad.slice(0, 5).map((b) => `${b.region}: chunk ${b.chunks.slice(0, 4).join(', ')}`).join('; ')}): the bytes changed between host and GPU memory, ` +
        'or something wrote into the regions during the restore. Restore again; if it repeats, check the GPU (nvidia-smi -q -d ECC).',
      { snapshot: manifest.name, id: manifest.id, regions: bad },
    );
  }
  return { seconds, devices };
}
