// A RAM-tier restore digests the regions copied first while the rest are still being copied
// (src/snapshot/copy-overlap.ts): a digest mismatch anywhere still fails the restore, naming the
// region and chunk; progress runs over the whole restore as one. Targets in two parts (a restore
// filling memory it makes, flows/fill.ts): the first part is copied before the rest exists, a
// region someone else writes into until a promise resolves is copied (again) after it, and a rest
// that cannot be made fails the restore with its own error.
import { describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { Manifest } from '../../src/manifest/manifest.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { splitIndex } from '../../src/snapshot/copy-overlap.js';
import { RegionStore } from '../../src/store/region-store.js';
import { fillRegion, holdsPattern, patternedRegions } from '../helpers/regions.js';
import { regionId } from '../../src/manifest/region-id.js';
import type { RestoreRegion } from '../../src/snapshot/snapshot-types.js';
import { tempDir } from '../helpers/tmp.js';

const KiB = 1024;
// The head is a, b, c (at least 90% of the bytes); d alone is the tail.
const SIZES = { a: 256 * KiB, b: 128 * KiB, c: 64 * KiB, d: 16 * KiB };

describe('splitIndex', () => {
  it('takes the first regions holding 90% of the bytes, and always leaves one for the tail', () => {
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
    const cache = await RamTier.create({ budgetBytes: 4 * 1024 * KiB, pin: false });
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
      await snap.restore({ regions: into, ram: cache }); // loads the RAM tier
      const seen: Array<{ done: number; total: number }> = [];
      const r = await snap.restore({ regions: into, ram: cache, onProgress: (p) => seen.push({ done: p.bytesDone, total: p.bytesTotal }) });
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
        await expect(snap.restore({ regions: into, ram: cache })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH', details: { regions: [{ region: `0/${where.key}`, chunks: [where.chunk] }] } });
        // from the RAM tier again (now loaded): the same
        await expect(snap.restore({ regions: into, ram: cache })).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH' });
        await expect(snap.restore({ regions: into, ram: cache, verifyDigests: false })).resolves.toMatchObject({ tier: 'ram' });
      } finally {
        close();
      }
    });
  }
});

describe('a RAM-tier restore into targets that come in two parts', () => {
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
    const cache = await RamTier.create({ budgetBytes: 4 * 1024 * KiB, pin: false });
    const targets = patternedRegions(Object.fromEntries(Object.keys(SIZES).map((k) => [`${k}-target`, SIZES[k as keyof typeof SIZES]])));
    const into = (key: string): RestoreRegion => ({ key, size: targets.get(`${key}-target`)!.size, memory: targets.get(`${key}-target`)!.memory });
    const close = () => {
      cache.close();
      for (const t of targets.values()) t.close();
    };
    return { snap, cache, into, targets, close };
  }
  const ids = (...keys: string[]) => new Set(keys.map((k) => regionId(0, k)));

  it('copies the first part before the rest exists, and a region written meanwhile again after the write', async () => {
    const { snap, cache, into, targets, close } = await setup();
    try {
      await snap.restore({ regions: Object.keys(SIZES).map(into), ram: cache }); // loads the RAM tier
      for (const t of targets.values()) fillRegion(t, 0);
      let firstCopied = false;
      let releaseRest!: () => void;
      const restMade = new Promise<void>((resolve) => (releaseRest = resolve));
      // "The engine's wake": writes into a (copied first) and c once the rest exists, then resolves.
      let wrote = false;
      const wake = restMade.then(() => {
        firstCopied = holdsPattern(targets.get('a-target')!, 'a'); // the first part landed before the rest was made
        fillRegion(targets.get('a-target')!, 0xee);
        fillRegion(targets.get('c-target')!, 0xee);
        wrote = true;
      });
      const rest = restMade.then(() => ({ regions: ['b', 'c', 'd'].map(into), late: { ids: ids('a', 'c'), after: wake } }));
      const restoring = snap.restoreStaged({ regions: [into('a')], ram: cache }, { first: ids('a'), rest });
      // The copy of the first part is a job of its own: it ends whether or not the rest is ever made.
      await waitUntil(() => holdsPattern(targets.get('a-target')!, 'a'));
      releaseRest();
      const r = await restoring;
      expect(firstCopied).toBe(true);
      expect(wrote).toBe(true);
      expect(r.bytes).toBe(Object.values(SIZES).reduce((n, s) => n + s, 0));
      for (const key of Object.keys(SIZES)) expect(holdsPattern(targets.get(`${key}-target`)!, key)).toBe(true);
    } finally {
      close();
    }
  });

  it('the tail is digested against the regions that came with the rest: a mismatch there fails the restore naming it', async () => {
    // The tail's digest is planned while the tail copies (once the head has landed): it must cover
    // the regions that joined with the rest, not only those the restore started with.
    const { snap, cache, into, close } = await setup({ key: 'd', chunk: 0 });
    try {
      const restore = () => snap.restoreStaged({ regions: [into('a')], ram: cache }, { first: ids('a'), rest: Promise.resolve({ regions: ['b', 'c', 'd'].map(into), late: { ids: ids(), after: Promise.resolve() } }) });
      await expect(restore()).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH', details: { regions: [{ region: '0/d', chunks: [0] }] } });
      await expect(restore()).rejects.toMatchObject({ code: 'E_DIGEST_MISMATCH', details: { regions: [{ region: '0/d', chunks: [0] }] } }); // from the RAM tier, loaded now
    } finally {
      close();
    }
  });

  it('a rest that cannot be made fails the restore with its own error, once the first part is copied', async () => {
    const { snap, cache, into, targets, close } = await setup();
    try {
      await snap.restore({ regions: Object.keys(SIZES).map(into), ram: cache });
      for (const t of targets.values()) fillRegion(t, 0);
      const rest = Promise.reject(Object.assign(new Error('the table does not match'), { code: 'E_MANIFEST_MISMATCH' }));
      await expect(snap.restoreStaged({ regions: [into('a')], ram: cache }, { first: ids('a'), rest })).rejects.toThrow('the table does not match');
      expect(holdsPattern(targets.get('a-target')!, 'a')).toBe(true); // its copy was over before the restore failed
    } finally {
      close();
    }
  });

  it('refuses a first part that is not the snapshot\'s', async () => {
    const { snap, cache, into, close } = await setup();
    try {
      const rest = new Promise<never>(() => undefined);
      await expect(snap.restoreStaged({ regions: [into('a')], ram: cache }, { first: ids('b'), rest })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
      await expect(snap.restoreStaged({ regions: [{ ...into('a'), size: 16 * KiB }], ram: cache }, { first: ids('a'), rest })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    } finally {
      close();
    }
  });
});

/** Polls `ok` on the event loop until it holds (no clock: the first part's copy ends on its own). */
async function waitUntil(ok: () => boolean): Promise<void> {
  while (!ok()) await new Promise((r) => setImmediate(r));
}
