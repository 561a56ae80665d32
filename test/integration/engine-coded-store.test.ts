// The engine flows over a store holding coded blobs (capture codec 'vsnap-c1'), with no RAM tier:
// the suspend's blob check accepts the coded sizes, the restore decodes them (CPU reference
// engine), and the engine answers as before. An incremental capture on top shares the coded blobs.
import { readFileSync, statSync, writeFileSync } from 'node:fs';

import { describe, expect, it } from 'vitest';

import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { codedOffsets, storedBytes } from '../../src/store/coded-blob.js';
import { RegionStore } from '../../src/store/region-store.js';
import { ask, useEngines } from '../helpers/engines.js';
import { rejection } from '../helpers/rejection.js';
import { tempDir } from '../helpers/tmp.js';

const { engine } = useEngines();

describe('the engine flows over coded store blobs (CPU reference engine)', () => {
  it('captures coded, suspends against the coded blobs, restores from the store with the same answer, and shares them incrementally', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, capture: { codec: 'vsnap-c1' } });
    const coded = [...snapshot.manifest.regions()].filter(({ region }) => region.codec);
    expect(coded.length).toBeGreaterThan(0); // the reference engine's BF16 weights shrink
    for (const { region } of snapshot.manifest.regions()) expect(statSync(store.blobPath(region.blob)).size).toBe(storedBytes(region));
    expect(snapshot.manifest.storedBytes).toBeLessThan(snapshot.manifest.totalBytes);

    const restored = await restoreEngine(snapshot, client);
    expect(restored.tier).toBe('store');
    expect(await ask(client)).toEqual(before);

    await suspendEngine(store, 'ref', client); // the blobs checked against their coded sizes
    await restoreEngine(snapshot, client);
    expect(await ask(client)).toEqual(before);

    const next = await captureEngine(store, 'ref', client, { base: snapshot, codec: 'vsnap-c1' });
    expect(next.lastCapture?.reusedBytes).toBe(snapshot.manifest.totalBytes); // nothing changed: every coded blob shared
    expect(next.manifest.data.ranks).toEqual(snapshot.manifest.data.ranks);
  });

  it('a coded chunk that does not decode is a damaged snapshot: the restore fails with the engine asleep, and recovery reloads the weights', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    const before = await ask(client);
    const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, capture: { codec: 'vsnap-c1' } });
    const region = [...snapshot.manifest.regions()].find(({ region }) => region.codec)!.region;
    const path = store.blobPath(region.blob);
    const bytes = readFileSync(path);
    bytes[codedOffsets(region.codec!)[0]! + 5] = 9; // chunk 0's mode: no such mode
    writeFileSync(path, bytes);

    const err = await rejection(restoreEngine(snapshot, client));
    expect(err.code).toBe('E_CODEC_CORRUPT');
    expect((await client.status()).sleeping).toBe(true);

    const report = await restoreEngine(snapshot, client, { recovery: 'reload' });
    expect(report).toMatchObject({ route: 'reloaded', recovery: { reason: 'damaged', code: 'E_CODEC_CORRUPT' } });
    expect(await ask(client)).toEqual(before);
  });

  it('refuses an unknown codec among the capture options', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    await expect(captureEngine(store, 'ref', client, { codec: 'zstd' as 'off' })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(captureEngine(store, 'ref', client, { codecs: 'vsnap-c1' } as object)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});
