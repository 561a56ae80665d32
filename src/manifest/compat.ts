import type { EngineInfo, ManifestData, ModelInfo, PlatformInfo, RegionInfo } from './types.js';

/**
 * One region of a live engine (or a set of regions about to be restored into).
 * @public
 */
export interface LiveRegion {
  /** The region's key, as in {@link RegionInfo.key}. */
  readonly key: string;
  /** Its size in bytes now. */
  readonly size: number;
  /** Checked when given. */
  readonly tag?: string;
}

/**
 * What a live engine looks like now, to check a snapshot against. Every field given is
 * compared; fields left out are not.
 * @public
 */
export interface LiveLayout {
  /** Engine facts to compare. */
  readonly engine?: Partial<EngineInfo>;
  /** Model facts to compare. */
  readonly model?: Partial<ModelInfo>;
  /** Platform facts to compare. */
  readonly platform?: Partial<PlatformInfo>;
  /** One entry per rank, in rank order. */
  readonly ranks: ReadonlyArray<{ readonly regions: readonly LiveRegion[] }>;
}

/**
 * One difference between a snapshot and a live layout.
 * @public
 */
export interface Mismatch {
  /** What differs. */
  readonly kind:
    | 'field'
    | 'rank-count'
    | 'region-missing'
    | 'region-unexpected'
    | 'region-size'
    | 'region-tag'
    | 'region-duplicate';
  /** Where: `model.id`, `ranks[0].regions["layers.0.weight"].size`, ... */
  readonly path: string;
  /** The snapshot's value. */
  readonly expected: unknown;
  /** The live value. */
  readonly actual: unknown;
  /** One line for people. */
  readonly message: string;
}

function show(v: unknown): string {
  return v === undefined ? 'nothing' : JSON.stringify(v);
}

function compareFields(
  section: 'engine' | 'model' | 'platform',
  snapshot: object | null,
  live: object | undefined,
  out: Mismatch[],
): void {
  if (!live) return;
  for (const [field, actual] of Object.entries(live)) {
    if (actual === undefined) continue;
    const expected = snapshot ? (snapshot as Record<string, unknown>)[field] : undefined;
    if (expected !== actual) {
      const path = `${section}.${field}`;
      out.push({ kind: 'field', path, expected, actual, message: `${path}: the snapshot has ${show(expected)}, the live engine ${show(actual)}` });
    }
  }
}

/**
 * Every difference between a manifest and a live layout, regions matched by key (order does
 * not matter). Empty when the snapshot can be restored.
 * @internal
 */
export function findMismatches(manifest: ManifestData, live: LiveLayout): Mismatch[] {
  const out: Mismatch[] = [];
  compareFields('engine', manifest.engine, live.engine, out);
  compareFields('model', manifest.model, live.model, out);
  compareFields('platform', manifest.platform, live.platform, out);
  if (manifest.ranks.length !== live.ranks.length) {
    out.push({
      kind: 'rank-count',
      path: 'ranks',
      expected: manifest.ranks.length,
      actual: live.ranks.length,
      message: `the snapshot has ${manifest.ranks.length} rank(s), the live engine ${live.ranks.length}`,
    });
  }
  const rankCount = Math.min(manifest.ranks.length, live.ranks.length);
  for (let r = 0; r < rankCount; r++) {
    const captured = new Map(manifest.ranks[r]!.regions.map((x) => [x.key, x]));
    const seen = new Set<string>();
    for (const region of live.ranks[r]!.regions) {
      const path = `ranks[${r}].regions[${JSON.stringify(region.key)}]`;
      if (seen.has(region.key)) {
        out.push({ kind: 'region-duplicate', path, expected: 1, actual: 2, message: `${path}: the live layout lists this key twice` });
        continue;
      }
      seen.add(region.key);
      const want = captured.get(region.key);
      if (!want) {
        out.push({ kind: 'region-unexpected', path, expected: undefined, actual: region.size, message: `${path}: live, but not in the snapshot` });
        continue;
      }
      if (want.size !== region.size) {
        out.push({
          kind: 'region-size',
          path: `${path}.size`,
          expected: want.size,
          actual: region.size,
          message: `${path}: ${want.size} bytes in the snapshot, ${region.size} live`,
        });
      }
      if (region.tag !== undefined && region.tag !== want.tag) {
        out.push({
          kind: 'region-tag',
          path: `${path}.tag`,
          expected: want.tag,
          actual: region.tag,
          message: `${path}: tagged ${show(want.tag)} in the snapshot, ${show(region.tag)} live`,
        });
      }
    }
    for (const key of captured.keys()) {
      if (!seen.has(key)) {
        const path = `ranks[${r}].regions[${JSON.stringify(key)}]`;
        out.push({ kind: 'region-missing', path, expected: captured.get(key)!.size, actual: undefined, message: `${path}: in the snapshot, missing live` });
      }
    }
  }
  return out;
}
