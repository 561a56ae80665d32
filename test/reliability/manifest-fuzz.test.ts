// Property-based cases (fast-check) of Manifest.parse: valid manifests are accepted and round-trip;
// mutated, arbitrary and truncated inputs never crash it: every rejection is a VsnapError
// E_MANIFEST_INVALID listing its issues, and whatever it accepts is consistent.
import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { blobDigest } from '../../src/manifest/blob-digest.js';
import { FULL, record, SEED } from './figures.js';

const RUNS = FULL ? 5_000 : 2_500; // per property; four properties
const tally = { cases: 0, accepted: 0, rejected: 0, crashes: 0, uncoded: 0 };
const byProperty: Record<string, number> = {};

const hex = (n: number) => fc.stringMatching(new RegExp(`^[0-9a-f]{${n}}$`));

/** A region whose blob name, checksum count and tensor offsets are consistent. */
const region = fc
  .record({
    key: fc.string({ minLength: 1, maxLength: 40 }),
    tag: fc.constantFrom('weights', 'kv_cache', 'other'),
    chunkSize: fc.constantFrom(4096, 8192, 65536, 1 << 20),
    size: fc.nat({ max: 256 << 10 }), // up to 64 checksums a region: the cases stay fast
    seed: hex(32),
  })
  .map(({ key, tag, chunkSize, size, seed }) => {
    const checksums = Array.from({ length: Math.ceil(size / chunkSize) }, (_, i) => `${seed.slice(0, 24)}${i.toString(16).padStart(8, '0')}`);
    return { key, tag, size, chunkSize, checksums, blob: blobDigest(size, chunkSize, checksums), tensors: [{ name: key, offset: 0, dtype: 'bfloat16', shape: [size] }] };
  });

const validManifest = fc
  .record({
    id: fc.stringMatching(/^[0-9a-z-]{8,64}$/),
    name: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,30}$/),
    ranks: fc.array(fc.uniqueArray(region, { selector: (r) => r.key, maxLength: 5 }), { minLength: 1, maxLength: 3 }),
    response: fc.option(
      fc.integer({ min: 1, max: 16 }).chain((maxTokens) =>
        fc.array(fc.nat({ max: 200_000 }), { maxLength: maxTokens }).map((tokenIds) => ({
          prompt: 'p',
          maxTokens,
          tokenIds,
          text: 't',
          logprobs: tokenIds.map((t) => -t / 1e5),
        })),
      ),
    ),
  })
  .map(({ id, name, ranks, response }) => ({
    schemaVersion: 1,
    id,
    name,
    createdAt: '2026-11-30T20:00:00.000Z',
    vsnapVersion: '0.1.0',
    checksumAlgorithm: 'xxh3-128',
    engine: null,
    model: null,
    platform: { kind: 'host' },
    ranks: ranks.map((regions, rank) => ({ rank, device: null, regions })),
    expectedResponse: response,
    labels: {},
  }));

type Json = unknown;

/** A mutation at a random place of a JSON value: replace, delete, or insert a value. */
function mutate(value: Json, path: number[], replacement: Json, kind: number): Json {
  if (value === null || typeof value !== 'object') return replacement;
  const entries = Array.isArray(value) ? value.map((v, i) => [i, v] as const) : Object.entries(value as Record<string, Json>);
  if (entries.length === 0 || path.length === 0) return kind === 0 ? replacement : value;
  const [key, child] = entries[path[0]! % entries.length]!;
  const copy: Record<string | number, Json> | Json[] = Array.isArray(value) ? [...value] : { ...(value as Record<string, Json>) };
  if (path.length === 1 && kind === 1) {
    if (Array.isArray(copy)) copy.splice(key as number, 1);
    else delete (copy as Record<string, Json>)[key];
  } else {
    (copy as Record<string | number, Json>)[key] = mutate(child, path.slice(1), replacement, kind);
  }
  return copy;
}

/** Parses; returns 'accepted' or 'rejected'; fails on a crash or an uncoded rejection. */
function parseOutcome(input: unknown): 'accepted' | 'rejected' {
  tally.cases++;
  let m: Manifest;
  try {
    m = Manifest.parse(input);
  } catch (err) {
    tally.rejected++;
    if (!(err instanceof VsnapError)) {
      tally.crashes++;
      throw err;
    }
    if (err.code !== 'E_MANIFEST_INVALID' || !Array.isArray(err.details.issues) || err.details.issues.length === 0) {
      tally.uncoded++;
      throw err;
    }
    return 'rejected';
  }
  tally.accepted++;
  // what is accepted is consistent
  for (const { region: r } of m.regions()) {
    expect(r.checksums.length).toBe(Math.ceil(r.size / r.chunkSize));
    expect(blobDigest(r.size, r.chunkSize, r.checksums)).toBe(r.blob);
  }
  const response = m.data.expectedResponse;
  if (response) {
    expect(response.tokenIds.length).toBeLessThanOrEqual(response.maxTokens);
    if (response.logprobs) expect(response.logprobs.length).toBe(response.tokenIds.length);
  }
  expect(Number.isSafeInteger(m.totalBytes)).toBe(true);
  return 'accepted';
}

function count(name: string, fn: () => void): void {
  const before = tally.cases;
  fn();
  byProperty[name] = tally.cases - before;
}

afterAll(() => {
  record('manifest-fuzz', { seed: SEED, fastCheck: fc.__version, ...tally, byProperty });
});

describe(`Manifest.parse, property-based (fast-check ${fc.__version}, seed ${SEED})`, () => {
  it('accepts every consistent manifest, and it round-trips through JSON', () => {
    count('valid', () =>
      fc.assert(
        fc.property(validManifest, (data) => {
          expect(parseOutcome(data)).toBe('accepted');
          const m = Manifest.parse(JSON.stringify(data));
          expect(Manifest.parse(JSON.stringify(m.toJSON())).toJSON()).toEqual(m.toJSON());
        }),
        { numRuns: RUNS, seed: SEED },
      ),
    );
  });

  it('a mutation anywhere (a value replaced, deleted or added): accepted consistent, or rejected with E_MANIFEST_INVALID', () => {
    count('mutated', () =>
      fc.assert(
        fc.property(validManifest, fc.array(fc.nat(), { minLength: 1, maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }), fc.nat({ max: 2 }), (data, path, value, kind) => {
          parseOutcome(mutate(data, path, value, kind));
        }),
        { numRuns: RUNS, seed: SEED + 1 },
      ),
    );
  });

  it('arbitrary JSON values and strings: never a crash', () => {
    count('arbitrary', () =>
      fc.assert(
        fc.property(fc.oneof(fc.jsonValue(), fc.string(), fc.json(), fc.anything()), (input) => {
          parseOutcome(input);
        }),
        { numRuns: RUNS, seed: SEED + 2 },
      ),
    );
  });

  it('truncated or bit-flipped manifest text: never a crash', () => {
    count('damaged text', () =>
      fc.assert(
        fc.property(validManifest, fc.nat(), fc.nat({ max: 255 }), fc.boolean(), (data, at, byte, truncate) => {
          const text = Buffer.from(JSON.stringify(data));
          const i = at % text.length;
          const damaged = truncate ? text.subarray(0, i) : Buffer.concat([text.subarray(0, i), Buffer.from([byte]), text.subarray(i + 1)]);
          parseOutcome(damaged.toString('utf8'));
        }),
        { numRuns: RUNS, seed: SEED + 3 },
      ),
    );
  });

  it('in all: at least 10,000 cases, 0 crashes, every rejection coded', () => {
    expect(tally.cases).toBeGreaterThanOrEqual(10_000);
    expect(tally.crashes).toBe(0);
    expect(tally.uncoded).toBe(0);
  });
});
