// The ESM and CommonJS builds loaded in one process (an app that imports vsnap while one of its
// dependencies requires it): errors are VsnapErrors to both, and both lend from one staging pool.
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { tempDir } from '../helpers/tmp.js';

const esmPath = fileURLToPath(new URL('../../dist/index.js', import.meta.url));
const cjsPath = fileURLToPath(new URL('../../dist/index.cjs', import.meta.url));
const dist = (file: string) => fileURLToPath(new URL(`../../dist/${file}`, import.meta.url));
type Vsnap = typeof import('../../src/index.js') & typeof import('../../src/plumbing.js');

async function load(): Promise<{ esm: Vsnap; cjs: Vsnap }> {
  const require = createRequire(import.meta.url);
  const esm = { ...(await import(esmPath)), ...(await import(dist('plumbing.js'))) } as Vsnap;
  const cjs = { ...require(cjsPath), ...require(dist('plumbing.cjs')) } as Vsnap;
  expect(esm.VsnapError).not.toBe(cjs.VsnapError); // two copies of the class: the case at hand
  return { esm, cjs };
}

describe('the ESM and CommonJS builds in one process', () => {
  it('an error thrown by either build is instanceof VsnapError of both', async () => {
    const { esm, cjs } = await load();
    for (const [from, other] of [
      [cjs, esm],
      [esm, cjs],
    ] as const) {
      const err = await from.RegionStore.open('').catch((e: unknown) => e);
      expect(err instanceof from.VsnapError).toBe(true);
      expect(err instanceof other.VsnapError).toBe(true);
      expect((err as { code: string }).code).toBe('E_INVALID_ARGUMENT');
    }
    expect(new Error('x') instanceof cjs.VsnapError).toBe(false);
  });

  it('both builds lend from one staging pool per process', async () => {
    const { esm, cjs } = await load();
    const root = tempDir();
    const region = esm.HostRegion.create(1024 * 1024);
    try {
      region.write(0, Buffer.alloc(1024 * 1024, 7));
      const store = await esm.RegionStore.open(root);
      await esm.Snapshot.capture(store, 'm', { regions: [{ key: 'w', size: region.size, memory: region.memory }], chunkSize: 1024 * 1024 });
      expect((await store.verify('m')).ok).toBe(true); // makes the pool (verify stages through it)
      const registry = (globalThis as Record<symbol, { size: number } | undefined>)[Symbol.for('vsnap.stagingPools.v1')];
      expect(registry?.size).toBe(1);
      const other = await cjs.RegionStore.open(root);
      expect((await other.verify('m')).ok).toBe(true); // same slot size: the same pool serves it
      expect(registry?.size).toBe(1);
    } finally {
      region.close();
      await esm.releaseIdleResources();
      await cjs.releaseIdleResources();
    }
    const registry = (globalThis as Record<symbol, { size: number } | undefined>)[Symbol.for('vsnap.stagingPools.v1')];
    expect(registry?.size).toBe(0);
  });
});
