import { readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it, vi } from 'vitest';

import { EngineClient, type EngineDigestTable } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { captureEngine, restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, engineDigests, startEngine, type TestEngine } from '../helpers/engine.js';
import { patternedRegions } from '../helpers/regions.js';
import { FaultyClient } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// Faults injected into the live-weights steps: the digest (the GPU kernel on a device; here the
// same native entry point) failing or disagreeing, and a shared blob vanishing before publish.
const faults = vi.hoisted(() => ({
  digest: undefined as undefined | ((call: number) => 'fail' | 'corrupt' | undefined),
  calls: 0,
  afterTransfer: undefined as undefined | (() => void),
}));

vi.mock('../../src/digest/index.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../src/digest/index.js')>();
  return {
    ...real,
    digestRegions: async (targets: Parameters<typeof real.digestRegions>[0]) => {
      const what = faults.digest?.(++faults.calls);
      if (what === 'fail') throw new VsnapError('E_CUDA', 'cuLaunchKernel (digest) failed: CUDA_ERROR_LAUNCH_FAILED (injected)');
      const r = await real.digestRegions(targets);
      if (what === 'corrupt') r.digests[0]![0] = '0'.repeat(32);
      return r;
    },
  };
});
vi.mock('../../src/transfer/transfer.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../src/transfer/transfer.js')>();
  return {
    ...real,
    runTransfer: async (...args: Parameters<typeof real.runTransfer>) => {
      const r = await real.runTransfer(...args);
      faults.afterTransfer?.();
      return r;
    },
  };
});

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  faults.digest = undefined;
  faults.afterTransfer = undefined;
  faults.calls = 0;
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

async function engine() {
  const e = await startEngine({ args: ['--layers', '3'] });
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  return client;
}
const openFds = () => readdirSync('/proc/self/fd').length;
const ask = async (client: EngineClient) => (await askCapital(client, 8)).ids;

describe('live weights under faults', () => {
  it('the dirty check fails here (a plugin without digest): the suspend fails, the engine keeps its weights, nothing is captured or leaked', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    const answer = await ask(client);
    const fds = openFds();
    faults.digest = () => 'fail';
    client.lack('digest'); // a plugin without digest: the live weights are digested here
    try {
      await expect(suspendEngine(store, 'ref', client)).rejects.toMatchObject({ code: 'E_CUDA' });
    } finally {
      client.lack();
    }
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    expect(await ask(client)).toEqual(answer);
    expect((await store.current('ref'))!.id).toBe(snap.id);
    expect(readdirSync(join(store.root, 'tmp')).filter((f) => !f.startsWith('.'))).toEqual([]);
    expect(openFds()).toBe(fds);
  });

  it.skipIf(!engineDigests())("the engine's own digest fails: the suspend fails with its error, the engine keeps its weights, nothing is exported, captured or leaked", async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    const answer = await ask(client);
    const fds = openFds();
    client.inject({
      route: 'digest',
      action: () => {
        throw new VsnapError('E_ENGINE_HTTP', 'POST /vsnap/v1/digest answered 500: RuntimeError: cuLaunchKernel (digest) failed with CUDA_ERROR_LAUNCH_FAILED (injected)', { status: 500 });
      },
    });
    client.calls.length = 0;
    await expect(suspendEngine(store, 'ref', client)).rejects.toMatchObject({ code: 'E_ENGINE_HTTP', message: /CUDA_ERROR_LAUNCH_FAILED \(injected\)/ });
    expect(client.calls.filter((r) => r === 'digest')).toHaveLength(1);
    expect(client.calls).not.toContain('export');
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false);
    expect(await ask(client)).toEqual(answer);
    expect((await store.current('ref'))!.id).toBe(snap.id);
    expect(readdirSync(join(store.root, 'tmp')).filter((f) => !f.startsWith('.'))).toEqual([]);
    expect(openFds()).toBe(fds);
    // The engine's digest answers the next time: the suspend goes through.
    await expect(suspendEngine(store, 'ref', client)).resolves.toMatchObject({ captured: false, liveCheck: { digestedIn: 'engine' } });
  });

  it.skipIf(!engineDigests())('a digest the engine sends for the wrong chunk count counts as changed: captured again, never trusted', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const snap = await captureEngine(store, 'ref', client);
    client.inject({
      route: 'digest',
      when: 'after',
      pass: true,
      rewrite: (tables: EngineDigestTable[]) => tables.map((t, i) => (i > 0 ? t : { ...t, regions: t.regions.map((r, j) => (j > 0 ? r : { ...r, digests: r.digests.slice(1) })) })),
    });
    const s = await suspendEngine(store, 'ref', client);
    const first = snap.manifest.data.ranks[0]!.regions[0]!;
    expect(s).toMatchObject({ captured: true, liveCheck: { checked: true, changed: [`0/${first.key}`], digestedIn: 'engine' } });
  });

  it('the digest fails at capture: recorded without digests (a warning), and the next suspend captures again rather than trust it', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.message);
    process.on('warning', onWarning);
    try {
      faults.digest = (call) => (call === 1 ? 'fail' : undefined);
      const snap = await captureEngine(store, 'ref', client);
      await new Promise((r) => setImmediate(r));
      expect(snap.manifest.data.digestAlgorithm).toBeNull();
      expect(warnings.join('\n')).toMatch(/GPU digests could not be taken/);
      const s = await suspendEngine(store, 'ref', client);
      expect(s).toMatchObject({ captured: true, liveCheck: { checked: false } });
      expect(s.snapshot.manifest.data.digestAlgorithm).toBe('vsnap-gd1');
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('restored memory that disagrees with the digests: E_DIGEST_MISMATCH, the engine goes back to sleep, a retry succeeds', async () => {
    const client = await engine();
    const store = await RegionStore.open(tempDir());
    const answer = await ask(client);
    const { snapshot } = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
    faults.digest = () => 'corrupt';
    const err = await restoreEngine(snapshot, client).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'E_DIGEST_MISMATCH', details: { recovered: true } });
    expect(((err as VsnapError).details.regions as Array<{ chunks: number[] }>)[0]!.chunks).toEqual([0]);
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    faults.digest = undefined;
    await restoreEngine(snapshot, client);
    expect(await ask(client)).toEqual(answer);
  });

  it('a blob shared with the base disappears before publish: E_BLOB_MISSING, nothing published, tmp cleaned', async () => {
    const regions = patternedRegions({ a: 8192, b: 8192 });
    try {
      const store = await RegionStore.open(tempDir());
      const list = () => [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory }));
      const base = await Snapshot.capture(store, 'inc', { regions: list(), chunkSize: 4096 });
      regions.get('b')!.write(0, Buffer.from([1, 2, 3]));
      const shared = base.manifest.data.ranks[0]!.regions.find((r) => r.key === 'a')!.blob;
      faults.afterTransfer = () => unlinkSync(store.blobPath(shared));
      await expect(Snapshot.capture(store, 'inc', { regions: list(), chunkSize: 4096, base })).rejects.toMatchObject({ code: 'E_BLOB_MISSING' });
      expect((await store.current('inc'))!.id).toBe(base.id);
      expect(readdirSync(join(store.root, 'tmp')).filter((f) => !f.startsWith('.'))).toEqual([]);
    } finally {
      for (const r of regions.values()) r.close();
    }
  });
});
