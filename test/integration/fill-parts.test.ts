import { readFileSync } from 'node:fs';

import { afterEach, describe, expect, it, vi } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { Batches } from '../../src/snapshot/batches.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import type { RestoreRegion } from '../../src/snapshot/snapshot-types.js';
import type { StagedRest } from '../../src/snapshot/staged.js';
import { VsnapError } from '../../src/errors.js';
import { makeFillMemoryInParts, type FillMemory, type FillRegion } from '../../src/flows/fill.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { RegionStore } from '../../src/store/region-store.js';
import type { TransferProgress } from '../../src/transfer/transfer.js';
import { ask, useEngines } from '../helpers/engines.js';
import { openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// A filled restore makes the rest of the weights' memory part by part (at most 64 regions a part,
// those holding a tensor of the model first) and the copy takes each part as it comes, instead of
// waiting for all of it: with thousands of small regions, making the memory costs about as long as
// copying it (src/flows/fill.ts, RestoreStages.more).

const { engine } = useEngines();
const memfds = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:vsnap-fill')).length;

afterEach(() => vi.restoreAllMocks());

const regions = (n: number): FillRegion[] => Array.from({ length: n }, (_, i) => ({ rank: 0, key: `r${i}`, tag: 'weights', size: 4096, tensors: i % 3 === 0 ? 0 : 1, device: undefined }));

describe('the rest of the memory made part by part', () => {
  it('parts of at most 64 regions, those holding a tensor of the model first, each told as it is made', async () => {
    const told: FillMemory[] = [];
    const parts = await makeFillMemoryInParts(regions(150), (p) => told.push(p));
    try {
      expect(told).toEqual(parts);
      expect(parts.map((p) => p.regions.length).sort((a, b) => b - a)).toEqual([64, 64, 22]);
      const keys = parts.flatMap((p) => p.regions.map((r) => r.key));
      expect(new Set(keys).size).toBe(150);
      // the 100 regions with tensors fill the first parts made (the part with the last of them and the first without is the second)
      const withTensors = new Set(regions(150).filter((r) => r.tensors > 0).map((r) => r.key));
      const first = parts.find((p) => p.regions.length === 64 && p.regions.every((r) => withTensors.has(r.key)));
      expect(first).toBeDefined();
    } finally {
      for (const p of parts) await p.close();
    }
    expect(memfds()).toBe(0);
  });

  it('a part that cannot be made: the error is thrown once every part in flight settled, and each one made was told (so it is let go)', async () => {
    const create = HostRegion.create.bind(HostRegion);
    let n = 0;
    vi.spyOn(HostRegion, 'create').mockImplementation((size, name) => {
      if (name === 'vsnap-fill' && ++n === 100) throw new VsnapError('E_NO_SPACE', 'injected: no memory for this part');
      return create(size, name);
    });
    const told: FillMemory[] = [];
    const fds = openFds();
    await expect(makeFillMemoryInParts(regions(200), (p) => told.push(p))).rejects.toMatchObject({ code: 'E_NO_SPACE', message: expect.stringMatching(/could not be made/) });
    expect(told.length).toBeGreaterThan(0);
    for (const p of told) await p.close();
    expect(memfds()).toBe(0);
    expect(openFds()).toEqual(fds);
  });

  it('a restore of an engine with more regions than a part holds copies the rest part by part, and answers as before', async () => {
    const { client } = await engine({ args: ['--layers', '80'] });
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 256 * 1024 * 1024, pin: false });
    try {
      const before = await ask(client);
      const { snapshot } = await suspendEngine(store, 'parts', client, { captureIfNeeded: true, tiers: { ram: cache } });
      const count = snapshot.manifest.regionCount;
      expect(count).toBeGreaterThan(64 + 8); // the rest, less the first part, takes two parts at least
      const progress: TransferProgress[] = [];
      const fds = openFds();
      const report = await restoreEngine(snapshot, client, { tiers: { ram: cache }, transfer: { onProgress: (p) => progress.push(p) } });
      expect(report.tier).toBe('ram');
      // each stage queued says so: the first part, the rest's parts as they were made (one at least), the head, the tail
      const stages = progress.filter((p) => p.phase === 'starting').length;
      expect(stages).toBeGreaterThanOrEqual(4); // the rest in one stage made 3
      expect(await ask(client)).toEqual(before);
      expect(memfds()).toBe(0);
      expect(openFds()).toEqual(fds);
    } finally {
      cache.close();
    }
  });

  it('a snapshot that describes no tensor streams every region of a batch (none can be told apart as written by the wake)', async () => {
    const MiB = 1024 * 1024;
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 64 * MiB, pin: false });
    const sources = [1, 2, 3].map((i) => {
      const r = HostRegion.create(MiB);
      r.write(0, Buffer.alloc(MiB, i));
      return r;
    });
    const targets = [1, 2, 3].map(() => HostRegion.create(MiB));
    try {
      const snap = await Snapshot.capture(store, 'untyped', { regions: sources.map((r, i) => ({ key: `r${i}`, size: MiB, memory: r.memory })), ram: cache });
      expect([...snap.manifest.regions()].every(({ region }) => region.tensors.length === 0)).toBe(true);
      const region = (i: number): RestoreRegion => ({ key: `r${i}`, size: MiB, memory: targets[i]!.memory });
      const more = new Batches<readonly RestoreRegion[]>();
      more.send([region(1)]);
      more.end();
      // the rest resolves only once the streamed region landed: without streaming it never would
      let landedTwo!: () => void;
      const two = new Promise<void>((resolve) => (landedTwo = resolve));
      const rest: Promise<StagedRest> = two.then(() => ({ regions: [region(1), region(2)], late: { ids: new Set<string>(), after: Promise.resolve() } }));
      const result = await snap.restoreStaged(
        { regions: [region(0)], ram: cache, onProgress: (p) => void (p.phase === 'copying' && p.bytesDone >= 2 * MiB && landedTwo()) },
        { first: new Set(['0/r0']), rest, more },
      );
      expect(result.tier).toBe('ram');
      for (const [i, t] of targets.entries()) expect(t.read(0, MiB).equals(Buffer.alloc(MiB, i + 1))).toBe(true);
    } finally {
      cache.close();
      for (const r of [...sources, ...targets]) r.close();
    }
  });
});
