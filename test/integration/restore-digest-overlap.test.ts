// A RAM-tier restore digests the regions copied first while the rest are still being copied
// (src/snapshot/copy-overlap.ts): a digest mismatch anywhere still fails the restore, naming the
// region and chunk; progress runs over the whole restore as one.
import { describe, expect, it } from 'vitest';

import { HostCache } from '../../src/cache/host-cache.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { splitIndex } from '../../src/snapshot/copy-overlap.js';
import { RegionStore } from '../../src/store/region-store.js';
import { holdsPattern, patternedRegions } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const KiB = 1024;
// The head is a, b, c (at least 85% of the bytes); d alone is the tail.
const SIZES = { a: 256 * KiB, b: 128 * KiB, c: 64 * KiB, d: 16 * KiB };

describe('splitIndex', () => {
  it('takes the first regions holding 85% of the bytes, and always leaves one for the tail', () => {
    expect(splitIndex([256, 128, 64, 16])).toBe(3);
    expect(splitIndex([10, 10])).toBe(1);
    expect(splitIndex([1, 1, 1, 97])).toBe(3);
    expect(splitIndex([97, 1, 1, 1])).toBe(1);
  });
});

describe('a RAM-tier restore with the head digested during the tail copy', () => {
  async function setup(tamper?: { key: string; chunk: number }) {
    const sources = patternedRegions(SIZES);
    const store = await RegionStore.open(tempDir());
    const regions = Object.keys(SIZES).map((key) => ({ key, size: sources.get(key)!.size, memory: sources.get(key)!.memory }));
    let snap = await Snapshot.capture(store, 'm', { regions, chunkSize: 16 * KiB });
    for (const r of sources.values()) r.close();
    if (tamper) {
      const data = structuredClone(snap.manifest.toJSON()) as unknown as { ranks: Array<{ regions: Array<{ key: string; digests: string[] }> }> };
      data.ranks[0]!.regions.find((r) => r.key === tamper.key)!.digests[tamper.chunk] = 'f'.repeat(32);
      snap = Snapshot.of(store, Manifest.parse(data));
    }
    const cache = await HostCache.create({ budgetBytes: 4 * 1024 * KiB, pin: false });
    const targets = patternedRegions(Object.fromEntries(Object.entries(SIZES).map(([k, v]) => [`${k}-target`, v])));
    const into = Object.keys(SIZES).map((key) => ({ key, size: targets.get(`${key}-target`)!.size, memory: targets.get(`${key}-target`)!.memory }));
    const close = () => {
      cache.close();
      for (const t of targets.values()) t.close();
    };
    return { snap, cache, into, targets, close };
  }

  it('restores every byte, with the progress of one restore and the digest time it waited for', async () => {
    const { snap, cache, into, targets, close } = await setup();
    try {
      await snap.restore({ regions: into, cache }); // loads the RAM tier
      const seen: Array<{ done: number; total: number }> = [];
      const r = await snap.restore({ regions: into, cache, onProgress: (p) => seen.push({ done: p.bytesDone, total: p.bytesTotal }) });
      expect(r.tier).toBe('ram');
      expect(r.bytes).toBe(Object.values(SIZES).reduce((n, s) => n + s, 0));
      expect(r.digestSeconds).toBeGreaterThanOrEqual(0);
      for (const key of Object.keys(SIZES)) expect(holdsPattern(targets.get(`${key}-target`)!, key)).toBe(true);
      for (const p of seen) expect(p.total).toBe(r.bytes);
      expect(seen.map((p) => p.done)).toEqual([...seen.map((p) => p.done)].sort((x, y) => x - y));
    } finally {
      close();
    }
  });

  for (const where of [{ key: 'a', chunk: 3, part: 'head' }, { key: 'd', chunk: 0, part: 'tail' }]) {
    it(`a digest mismatch in the ${where.part} fails the restore naming its region and chunk`, async () => {
      const { snap, cache, into, close } = await setup(where);
      try {
        await expect(snap.restore({ regions: into, cache })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH', details: { regions: [{ region: `0/${where.key}`, chunks: [where.chunk] }] } });
        // from the RAM tier again (now loaded): the same
        await expect(snap.restore({ regions: into, cache })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH' });
        await expect(snap.restore({ regions: into, cache, verifyDigests: false })).resolves.toMatchObject({ tier: 'ram' });
      } finally {
        close();
      }
    });
  }
});
