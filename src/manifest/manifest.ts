import type { z } from 'zod';

import { VsnapError } from '../errors.js';
import { blobDigest } from './blob-digest.js';
import { findMismatches, type LiveLayout, type Mismatch } from './compat.js';
import { ManifestSchema } from './schema.js';
import type { ManifestData, RegionInfo } from './types.js';

/**
 * One problem found by schema validation.
 * @public
 */
export interface ManifestIssue {
  /** Where, e.g. `ranks[0].regions[3].size`. */
  readonly path: string;
  /** What is wrong there. */
  readonly message: string;
}

function formatPath(path: ReadonlyArray<PropertyKey>): string {
  let out = '';
  for (const p of path) {
    if (typeof p === 'number') out += `[${p}]`;
    else out += out ? `.${String(p)}` : String(p);
  }
  return out || '(root)';
}

function toIssues(error: z.ZodError): ManifestIssue[] {
  return error.issues.map((i) => ({ path: formatPath(i.path), message: i.message }));
}

/**
 * A snapshot's manifest: everything a restore depends on (engine, model, platform, and per rank
 * each region's key, tag, size, chunk checksums and blob), validated with a versioned schema.
 * Immutable.
 * @public
 */
export class Manifest {
  /** The validated data. */
  readonly data: ManifestData;
  /**
   * False only for a capture made with hash `deferred` (see {@link CaptureOptions.hash}) that is
   * not persisted yet: its regions' `checksums` are empty and their `blob` is `''` until
   * {@link Snapshot.persist} computes them. Such a capture lives in the RAM tier only, is vouched
   * for by its GPU `digests`, and is never written to a store as it is.
   */
  readonly checksummed: boolean;

  private constructor(data: ManifestData, checksummed = true) {
    this.data = data;
    this.checksummed = checksummed;
  }

  /**
   * The manifest of a capture whose XXH3 checksums are deferred: everything but the checksums and
   * blob names is validated as {@link Manifest.parse} does (with placeholders in their place),
   * and every region must carry its GPU digests. @internal
   */
  static awaitingChecksums(data: ManifestData, source = 'manifest'): Manifest {
    const zero = '0'.repeat(32);
    const withPlaceholders = {
      ...data,
      ranks: data.ranks.map((rank) => ({
        ...rank,
        regions: rank.regions.map((r) => {
          const checksums = new Array<string>(r.chunkSize > 0 ? Math.ceil(r.size / r.chunkSize) : 0).fill(zero);
          return { ...r, checksums, blob: blobDigest(r.size, r.chunkSize, checksums) };
        }),
      })),
    };
    const parsed = Manifest.parse(withPlaceholders, source).data;
    if (parsed.ranks.some((rank) => rank.regions.some((r) => !r.digests))) {
      throw new VsnapError('E_INTERNAL', `${source}: a capture with its checksums deferred needs the GPU digest of every region`);
    }
    return new Manifest({ ...parsed, ranks: parsed.ranks.map((rank) => ({ ...rank, regions: rank.regions.map((r) => ({ ...r, checksums: [], blob: '' })) })) }, false);
  }

  /**
   * Validates `input` (parsed JSON, or a JSON string) against schema v2 (v1 is migrated: no GPU digests). Throws
   * E_MANIFEST_INVALID listing every problem with its path.
   */
  static parse(input: unknown, source = 'manifest'): Manifest {
    let value = input;
    if (typeof input === 'string') {
      try {
        value = JSON.parse(input);
      } catch (err) {
        throw new VsnapError('E_MANIFEST_INVALID', `${source} is not valid JSON: ${(err as Error).message}`, {
          issues: [{ path: '(root)', message: 'not JSON' }],
        });
      }
    }
    const version = (value as { schemaVersion?: unknown } | null)?.schemaVersion;
    if (typeof version === 'number' && version > 2) {
      throw new VsnapError('E_MANIFEST_INVALID', `${source} has schema version ${version}; this vsnap reads versions 1 and 2. Upgrade vsnap.`, {
        issues: [{ path: 'schemaVersion', message: `unsupported version ${version}` }],
      });
    }
    const result = ManifestSchema.safeParse(value);
    if (!result.success) {
      const issues = toIssues(result.error);
      throw new VsnapError(
        'E_MANIFEST_INVALID',
        `${source} is invalid (${issues.length} problem${issues.length === 1 ? '' : 's'}):\n` +
          issues.map((i) => `  - ${i.path}: ${i.message}`).join('\n'),
        { issues },
      );
    }
    return new Manifest(result.data);
  }

  /** The snapshot's name. */
  get name(): string {
    return this.data.name;
  }
  /** The snapshot's id (unique in the store, sortable by creation time). */
  get id(): string {
    return this.data.id;
  }
  /** Bytes of region data across all ranks. */
  get totalBytes(): number {
    return this.data.ranks.reduce((sum, rank) => sum + rank.regions.reduce((s, r) => s + r.size, 0), 0);
  }
  /**
   * Bytes the store's blobs of this capture take: the coded sizes of regions stored coded
   * (docs/compression.md), the raw size of the others; {@link Manifest.totalBytes} when none is coded.
   * A blob shared by several regions counts once for each.
   */
  get storedBytes(): number {
    return this.data.ranks.reduce((sum, rank) => sum + rank.regions.reduce((s, r) => s + (r.codec ? r.codec.codedSizes.reduce((a, b) => a + b, 0) : r.size), 0), 0);
  }
  /** Number of regions across all ranks. */
  get regionCount(): number {
    return this.data.ranks.reduce((n, rank) => n + rank.regions.length, 0);
  }

  /** Every region with its rank, in manifest order. */
  *regions(): IterableIterator<{ rank: number; region: RegionInfo }> {
    for (const rank of this.data.ranks) for (const region of rank.regions) yield { rank: rank.rank, region };
  }

  /** Every difference from a live layout (empty when compatible). Regions are matched by key. */
  checkCompatibility(live: LiveLayout): Mismatch[] {
    return findMismatches(this.data, live);
  }

  /** Throws E_MANIFEST_MISMATCH listing every difference from the live layout, if any. */
  assertCompatible(live: LiveLayout): void {
    const mismatches = this.checkCompatibility(live);
    if (mismatches.length === 0) return;
    const shown = mismatches.slice(0, 20).map((m) => `  - ${m.message}`);
    if (mismatches.length > 20) shown.push(`  - ... and ${mismatches.length - 20} more (see details.mismatches)`);
    throw new VsnapError(
      'E_MANIFEST_MISMATCH',
      `snapshot '${this.name}' (${this.id}) does not match the live layout; refusing to restore. ` +
        `${mismatches.length} difference${mismatches.length === 1 ? '' : 's'}:\n${shown.join('\n')}\n` +
        'Restore a snapshot taken from this engine and model, or capture a new one.',
      { snapshot: this.name, id: this.id, mismatches },
    );
  }

  /** The JSON form (what the store writes). */
  toJSON(): ManifestData {
    return this.data;
  }
}
