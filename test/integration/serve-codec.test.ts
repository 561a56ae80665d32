import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import type { Manifest } from '../../src/manifest/manifest.js';
import { parseConfig } from '../../src/serve/config.js';
import { serve, type ServeHandle } from '../../src/serve/serve.js';
import { RegionStore } from '../../src/store/region-store.js';
import { freePort, probeUntil } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

// `codec: vsnap-c1` in the serve configuration: the captures serve makes land coded in the store
// and in the RAM tier (CPU reference engine, host memory).

let handle: ServeHandle | undefined;
afterEach(async () => {
  await handle?.close();
  handle = undefined;
});

type RamStatus = { ramTier: { entries: Array<{ name: string; id: string; bytes: number }> } };

async function ramEntries(url: string): Promise<RamStatus['ramTier']['entries']> {
  return ((await (await request(`${url}/api/status`)).body.json()) as RamStatus).ramTier.entries;
}

/** How many regions of a capture have coded blobs. */
function codedRegions(manifest: Manifest): number {
  return [...manifest.regions()].filter(({ region }) => region.codec?.name === 'vsnap-c1').length;
}

/**
 * A RAM-tier entry held coded: its bytes are the store's coded chunks (a raw one without its 64-byte
 * header) each padded to 16 bytes, less than the raw bytes (which a raw tier holds, each region
 * rounded up to 4 KiB).
 */
function expectHeldCoded(bytes: number, manifest: Manifest): void {
  const chunks = [...manifest.regions()].reduce((n, { region }) => n + region.checksums.length, 0);
  expect(bytes).toBeLessThan(manifest.totalBytes);
  expect(bytes).toBeLessThanOrEqual(manifest.storedBytes + 15 * chunks);
}

describe('vsnap serve with codec vsnap-c1', () => {
  it('the boot capture lands coded in the store and the RAM tier; the capture after a recovery (materialize) too', async () => {
    const port = await freePort();
    const dir = tempDir();
    const config = parseConfig(
      `listen: { port: 0 }\nstore: ${dir}\nramTierGiB: 0.05\ncodec: vsnap-c1\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n  m1:\n` +
        `    command: node\n    args: [examples/quickstart/reference-engine.mjs, --port, "\${PORT}", --seed, "1", --model, m1]\n    port: ${port}\n    token: engine-token-1\n    memoryGiB: 0.6\n`,
      'test.yaml',
    );
    handle = await serve(config, { log: () => undefined, stateDir: tempDir() });
    await handle.booted;
    const url = handle.agent.url;
    const store = await RegionStore.open(dir);

    const booted = (await store.current('m1'))!;
    expect(codedRegions(booted)).toBeGreaterThan(0); // the reference engine's BF16 weights shrink
    expect(booted.storedBytes).toBeLessThan(booted.totalBytes);
    const [held] = await ramEntries(url);
    expect(held).toMatchObject({ name: 'm1', id: booted.id });
    expectHeldCoded(held!.bytes, booted);

    // The snapshot gone from the store: the wake reloads the weights, then captures a new one in the background.
    await store.remove('m1');
    const asked = await request(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', prompt: 'The capital of France is', max_tokens: 2 }) });
    expect(asked.statusCode).toBe(200);
    await asked.body.dump();
    const materialized = await probeUntil(async () => (await store.current('m1')) ?? undefined);
    expect(materialized.id).not.toBe(booted.id);
    expect(codedRegions(materialized)).toBe(codedRegions(booted));
    const entry = await probeUntil(async () => (await ramEntries(url)).find((e) => e.id === materialized.id));
    expectHeldCoded(entry.bytes, materialized);
  });
});
