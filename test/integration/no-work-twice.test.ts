import { readFileSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import type { EngineClient } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import { firstRegions } from '../../src/flows/fill.js';
import { native } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { MappedRegions } from '../../src/regions/mapped.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, engineDigests, startEngine, syncWeights } from '../helpers/engine.js';
import { FaultyClient, openFds } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// Issue 14, "no work twice": within one flow every region is exported once and mapped once (the
// host backend counts its mmaps the way the CUDA backend counts its imports), and no mapping
// outlives the flow, on success or failure.

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

/** Mappings of memfds (the reference engine's weights, our HostRegions) in this process now. */
const memfdMappings = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('/memfd:')).length;
const maps = (): number => native().regionCounters().hostMaps + native().regionCounters().imports;

async function setup() {
  const engine = await startEngine();
  const client = new FaultyClient({ baseUrl: engine.url, token: engine.token });
  cleanup.push(() => engine.stop(), () => client.close());
  const store = await RegionStore.open(tempDir());
  return { engine, client, store };
}

/** Runs `flow` and returns how many regions it mapped and how many exports it asked for. */
async function counted<T>(client: FaultyClient, flow: () => Promise<T>): Promise<{ value: T; mapped: number; exports: number }> {
  client.calls.length = 0;
  const before = maps();
  const value = await flow();
  return { value, mapped: maps() - before, exports: client.calls.filter((c) => c === 'export').length };
}

const ask = async (client: EngineClient) => (await askCapital(client, 8)).ids;

describe('no work twice: one export and one mapping per region per flow', () => {
  it('capture, suspend, restore from the store and from the RAM tier, and a stale suspend that captures again', async () => {
    const { client, store } = await setup();
    const answer = await ask(client);
    const fds = openFds();
    const mappings = memfdMappings();

    const capture = await counted(client, () => captureEngine(store, 'ref', client));
    const n = capture.value.manifest.data.ranks[0]!.regions.length;
    expect(n).toBeGreaterThan(2);
    // The capture's GPU digests and its copy share one mapping (was 2n).
    expect(capture).toMatchObject({ mapped: n, exports: 1 });

    // The dirty check digested by the engine's workers: nothing exported, nothing mapped here.
    const inEngine = engineDigests();
    expect(await counted(client, () => suspendEngine(store, 'ref', client))).toMatchObject(inEngine ? { mapped: 0, exports: 0 } : { mapped: n, exports: 1 });
    // Digested here instead (a plugin without digest): one export, one mapping.
    await restoreEngine(capture.value, client);
    client.lack('digest');
    try {
      expect(await counted(client, () => suspendEngine(store, 'ref', client))).toMatchObject({ mapped: n, exports: 1 });
    } finally {
      client.lack();
    }
    // The hydrate and the digest that verifies it share one mapping (was 2n). The restore fills memory
    // made here while the engine's wake adopts it: no export, one mapping of that memory.
    const restored = await counted(client, () => restoreEngine(capture.value, client));
    expect(restored).toMatchObject({ mapped: n, exports: 0 });
    expect(Object.keys(restored.value.phases)).toContain('verifyDigests');
    expect(await ask(client)).toEqual(answer);

    const cache = await RamTier.create({ budgetBytes: 64 * 1024 * 1024, pin: false });
    cleanup.push(() => cache.close());
    for (const tier of ['store', 'ram']) {
      await suspendEngine(store, 'ref', client);
      const r = await counted(client, () => restoreEngine(capture.value, client, { tiers: { ram: cache } }));
      expect(r.value.tier).toBe(tier);
      expect(r).toMatchObject({ mapped: n, exports: 0 });
    }
    // The other targets (a plugin that cannot describe its regions asleep: the engine's wake, then its export): one export, one mapping of it,
    // besides the first part's memory, made before the engine answered (it could not know) and let go.
    await suspendEngine(store, 'ref', client);
    client.lack('describe');
    const first = firstRegions([...capture.value.manifest.regions()].map(({ rank, region }) => ({ rank, key: region.key, tag: region.tag, size: region.size, tensors: region.tensors.length, device: undefined }))).size;
    try {
      expect(await counted(client, () => restoreEngine(capture.value, client, { tiers: { ram: cache } }))).toMatchObject({ mapped: n + first, exports: 1 });
    } finally {
      client.lack();
    }

    // Weights changed in place: the engine's digest finds it; the new capture's digests and its copy share one mapping (was 3n).
    await syncWeights(client.baseUrl, 2, [1]);
    const stale = await counted(client, () => suspendEngine(store, 'ref', client));
    expect(stale.value.captured).toBe(true);
    expect(stale).toMatchObject({ mapped: n, exports: 1 });
    await restoreEngine(stale.value.snapshot, client);

    expect(openFds()).toEqual(fds);
    expect(memfdMappings()).toBe(mappings);
  });
});

describe('MappedRegions: nothing stays mapped or open when opening fails', () => {
  it('a descriptor missing, or a region larger than its memory: rejected, nothing mapped, every region mapped so far unmapped', async () => {
    const regions = Array.from({ length: 40 }, () => HostRegion.create(1 << 16));
    cleanup.push(() => regions.forEach((r) => r.close()));
    const fds = openFds();
    const mappings = memfdMappings();
    const list = regions.map((r) => ({ memory: { kind: 'host' as const, fd: r.fd }, size: r.size }));

    const missing = await MappedRegions.open([...list, { memory: { kind: 'host', fd: 999_999 }, size: 4096 }]).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(VsnapError);
    expect((missing as VsnapError).code).toBe('E_INVALID_ARGUMENT');

    // The bad region comes last, so the worker threads map others first, then undo them (one
    // region at a time; the batched form checks every size before it maps anything).
    const before = maps();
    const tooBig = await MappedRegions.open([...list, { memory: { kind: 'host', fd: regions[0]!.fd }, size: 1 << 20 }], { mapping: 'per-region' }).catch((e: unknown) => e);
    expect(tooBig).toBeInstanceOf(VsnapError);
    expect((tooBig as VsnapError).message).toMatch(/region 40: .*holds 65536 bytes/);
    expect(maps() - before).toBeGreaterThan(0);
    expect(memfdMappings()).toBe(mappings);
    expect(openFds()).toEqual(fds);

    const set = await MappedRegions.open(list);
    expect(memfdMappings()).toBe(mappings + regions.length);
    await set.close();
    await set.close(); // twice is fine
    expect(() => set.memory(0)).toThrow(/closed/);
    expect(memfdMappings()).toBe(mappings);
    expect(openFds()).toEqual(fds);
  });

  it('a transfer that holds a region keeps it until it ends, even when the set is closed meanwhile', async () => {
    const region = HostRegion.create(1 << 20);
    cleanup.push(() => region.close());
    const mappings = memfdMappings();
    const set = await MappedRegions.open([{ memory: { kind: 'host', fd: region.fd }, size: region.size }]);
    const { digestRegions } = await import('../../src/digest/index.js');
    const digest = digestRegions([{ size: region.size, chunkSize: 1 << 16, memory: set.memory(0) }]);
    const closing = set.close();
    const [result] = await Promise.all([digest, closing]);
    expect(result.digests[0]).toHaveLength(16);
    expect(memfdMappings()).toBe(mappings);
  });
});

describe('a restore that fails after the regions were mapped leaves no mapping and no descriptor behind', () => {
  for (const route of ['wakeKv', 'complete'] as const) {
    it(`${route} fails`, async () => {
      const { client, store } = await setup();
      const answer = await ask(client);
      const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
      await restoreEngine(snapshot, client);
      await suspendEngine(store, 'ref', client);
      const fds = openFds();
      const mappings = memfdMappings();
      client.inject({ route });
      const err = (await restoreEngine(snapshot, client, { onWarning: () => undefined }).catch((x: unknown) => x)) as VsnapError;
      expect(err).toBeInstanceOf(VsnapError);
      expect(err.details.recovered).toBe(true);
      expect(memfdMappings()).toBe(mappings);
      expect(openFds()).toEqual(fds);
      await restoreEngine(snapshot, client);
      expect(await ask(client)).toEqual(answer);
    });
  }

  for (const [targets, route] of [['wake', 'export'], ['fill', 'adopt']] as const) {
    it(`the engine dies after the ${route} (targets: ${targets}): the restore fails, nothing of it stays mapped or open`, async () => {
      const { engine, client, store } = await setup();
      const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
      const fds = openFds();
      const mappings = memfdMappings();
      if (targets === 'wake') client.lack('describe');
      try {
        client.inject({ route, pass: true, when: 'after', action: () => process.kill(engine.enginePid, 'SIGKILL') });
        const err = (await restoreEngine(snapshot, client, { onWarning: () => undefined }).catch((x: unknown) => x)) as VsnapError;
        expect(err).toBeInstanceOf(VsnapError);
      } finally {
        client.lack();
      }
      expect(memfdMappings()).toBe(mappings);
      expect(openFds()).toEqual(fds);
    });
  }
});
