// The engine flows over a store holding coded blobs (capture codec 'vsnap-c1'), with no RAM tier:
// the suspend's blob check accepts the coded sizes, the restore decodes them (CPU reference
// engine), and the engine answers as before. An incremental capture on top shares the coded blobs.
import { statSync } from 'node:fs';

import { describe, expect, it } from 'vitest';

import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { storedBytes } from '../../src/store/coded-blob.js';
import { RegionStore } from '../../src/store/region-store.js';
import { ask, useEngines } from '../helpers/engines.js';
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

  it('refuses an unknown codec among the capture options', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    await expect(captureEngine(store, 'ref', client, { codec: 'zstd' as 'off' })).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(captureEngine(store, 'ref', client, { codecs: 'vsnap-c1' } as object)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
  });
});
