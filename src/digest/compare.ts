import { changedChunks, digestRegions, type DigestResult, type DigestTarget } from './index.js';
import { VsnapError } from '../errors.js';
import type { Manifest } from '../manifest/manifest.js';
import type { RegionInfo } from '../manifest/types.js';
import type { RegionMemory } from '../regions/memory.js';
import { regionId } from '../manifest/region-id.js';

// Live memory compared with a snapshot's GPU digests: the dirty check before a discard (checkLive)
// and the verification of restored memory (verifyRestored).

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
  /**
   * Where the live weights were digested: `engine`, by its workers over the memory they have
   * mapped (plugins whose status says `digest`); `sdk`, here, through an export of the weights.
   * Absent when nothing was compared.
   */
  readonly digestedIn?: 'engine' | 'sdk';
}

/**
 * What a digest of live regions will compare: each live region matched to the snapshot's region of
 * its rank and key, with the chunking to digest it in. Built apart from the digest itself, so a
 * restore can build its tail's while the tail is still copying. @internal
 */
export interface DigestPlan {
  readonly pairs: ReadonlyArray<{ readonly region: RegionInfo; readonly ref: string; readonly target: DigestTarget }>;
}

/** Matches live regions to the snapshot's (by rank and key), with the chunking of the snapshot's regions. */
function planDigest(manifest: Manifest, live: readonly LiveRegionRef[]): DigestPlan {
  const byId = new Map(live.map((l) => [regionId(l.rank, l.key), l]));
  const pairs: Array<{ region: RegionInfo; ref: string; target: DigestTarget }> = [];
  for (const { rank, region } of manifest.regions()) {
    const ref = regionId(rank, region.key);
    const l = byId.get(ref);
    if (l) pairs.push({ region, ref, target: { size: region.size, chunkSize: region.chunkSize, memory: l.memory } });
  }
  return { pairs };
}

/** Digests a plan's live regions. */
async function runDigest(plan: DigestPlan): Promise<{ pairs: Array<{ region: RegionInfo; ref: string; actual: string[] }>; seconds: number; bytes: number; devices: DigestResult['devices'] }> {
  const { pairs } = plan;
  const result = await digestRegions(pairs.map((p) => p.target));
  return {
    pairs: pairs.map((p, i) => ({ region: p.region, ref: p.ref, actual: result.digests[i]! })),
    seconds: result.seconds,
    bytes: pairs.reduce((s, p) => s + p.region.size, 0),
    devices: result.devices,
  };
}

/** Digests live regions with the chunking of the snapshot's regions (matched by rank and key). */
function digestAgainst(manifest: Manifest, live: readonly LiveRegionRef[]): ReturnType<typeof runDigest> {
  return runDigest(planDigest(manifest, live));
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
  return { checked: true, changed, bytes, seconds, digestedIn: 'sdk' };
}

/**
 * The chunk size every region of the manifest was digested in, when it has GPU digests and one
 * chunk size throughout (what an engine's own digest is asked for); undefined otherwise.
 * @internal
 */
export function uniformDigestChunk(manifest: Manifest): number | undefined {
  let chunk: number | undefined;
  for (const { region } of manifest.regions()) {
    if (!region.digests || (chunk !== undefined && region.chunkSize !== chunk)) return undefined;
    chunk = region.chunkSize;
  }
  return chunk;
}

/**
 * The dirty check from digests the engine's workers computed over their own weights
 * (`vsnap_digest`): each of the snapshot's regions against the live region of its rank and key; a
 * region the engine did not digest counts as changed.
 * @internal
 */
export function checkDigested(
  manifest: Manifest,
  ranks: ReadonlyArray<{ readonly rank: number; readonly regions: ReadonlyArray<{ readonly key: string; readonly digests: readonly string[] }> }>,
  seconds: number,
): LiveCheckReport {
  const live = new Map<string, readonly string[]>();
  for (const r of ranks) for (const region of r.regions) live.set(regionId(r.rank, region.key), region.digests);
  const changed: string[] = [];
  let bytes = 0;
  for (const { rank, region } of manifest.regions()) {
    const id = regionId(rank, region.key);
    const actual = live.get(id);
    if (actual) bytes += region.size;
    if (!actual || changedChunks(region.digests ?? [], actual).length > 0) changed.push(id);
  }
  return { checked: true, changed, bytes, seconds, digestedIn: 'engine' };
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
  return verifyPlanned(manifest, planVerify(manifest, live, enabled));
}

/**
 * The first half of {@link verifyRestoredByDevice}: what it will digest, or undefined when it is
 * skipped (the snapshot has no digests, or `enabled` is false). @internal
 */
export function planVerify(manifest: Manifest, live: readonly LiveRegionRef[], enabled = true): DigestPlan | undefined {
  if (!enabled || [...manifest.regions()].some(({ region }) => !region.digests)) return undefined;
  return planDigest(manifest, live);
}

/**
 * The second half of {@link verifyRestoredByDevice}: digests a plan's regions and compares them
 * with the snapshot (undefined for a skipped one). Throws E_DIGEST_MISMATCH. @internal
 */
export async function verifyPlanned(manifest: Manifest, plan: DigestPlan | undefined): Promise<{ seconds: number; devices: DigestResult['devices'] } | undefined> {
  if (!plan) return undefined;
  const { pairs, seconds, devices } = await runDigest(plan);
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
