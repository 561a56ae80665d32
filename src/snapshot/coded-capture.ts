import { regionHint } from '../cache/coded-tier.js';
import { invalidArgument } from '../errors.js';
import { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { RegionCodec } from '../manifest/types.js';
import { codeBlobFile } from '../store/coded-blob.js';

/** How a capture writes its blobs into the store ({@link CaptureOptions.codec}). @public */
export type StoreCodec = 'vsnap-c1' | 'off';

/** Checks a capture's `codec` option; `off` when absent. @internal */
export function checkStoreCodec(codec: unknown): StoreCodec {
  const c = codec ?? 'off';
  if (c !== 'vsnap-c1' && c !== 'off') invalidArgument('codec', "'vsnap-c1' or 'off'", codec);
  return c as StoreCodec;
}

/**
 * Codes a capture's fresh blobs (raw tmp files of its transaction, by region id) on the CPU
 * before they are published, and returns the manifest naming the coded blobs (`codec` and
 * `blob` of each region that shrank; the others stay raw). Regions without a tmp file (shared
 * with a base capture) keep their entry as it is.
 * @internal
 */
export async function codeCapturedBlobs(manifest: Manifest, tmpPaths: ReadonlyMap<string, string>): Promise<Manifest> {
  const coded = new Map<string, { codec: RegionCodec; digest: string }>();
  for (const { rank, region } of manifest.regions()) {
    const id = regionId(rank, region.key);
    const path = tmpPaths.get(id);
    if (path === undefined || region.codec) continue;
    const done = await codeBlobFile(path, region, regionHint(region));
    if (done) coded.set(id, done);
  }
  return withCodedBlobs(manifest, coded);
}

/**
 * The manifest with these regions' blobs coded (by region id: their `codec` and blob name); the
 * others as they are.
 * @internal
 */
export function withCodedBlobs(manifest: Manifest, coded: ReadonlyMap<string, { codec: RegionCodec; digest: string }>): Manifest {
  if (coded.size === 0) return manifest;
  return Manifest.parse(
    {
      ...manifest.data,
      ranks: manifest.data.ranks.map((rank) => ({
        ...rank,
        regions: rank.regions.map((r) => {
          const c = coded.get(regionId(rank.rank, r.key));
          return c ? { ...r, blob: c.digest, codec: c.codec } : r;
        }),
      })),
    },
    `manifest of '${manifest.name}'`,
  );
}
