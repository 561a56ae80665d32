import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import { RegistryClient } from '../../src/registry/registry.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { parseConfig } from '../../src/serve/config.js';
import { SwapController } from '../../src/swap/controller.js';
import { serve } from '../../src/serve/serve.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { freePort } from '../helpers/net.js';
import { registryAvailable, startRegistry, type TestRegistry } from '../helpers/registry.js';
import { tempDir } from '../helpers/tmp.js';

// A registry reference as a snapshot source (issue 17): restoreEngine's SnapshotRef `from` and a
// `vsnap serve` model's `registry:`, against the real distribution registry (Debian's
// docker-registry) on loopback and the CPU reference engine. The registry's own access log tells
// whether a restore went to the network.

const run = registryAvailable();
const quiet = { onWarning: () => undefined };

/** One completion for model 'ref' through the agent: answered with 200. */
async function completesThrough(agentUrl: string): Promise<void> {
  const r = await request(`${agentUrl}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'ref', prompt: 'The capital of France is', max_tokens: 8 }),
  });
  expect(r.statusCode).toBe(200);
  await r.body.dump();
}

/** A serve, booted (every model ready), then closed. */
async function bootAndClose(started: ReturnType<typeof serve>): Promise<void> {
  const handle = await started;
  try {
    await handle.booted;
  } finally {
    await handle.close();
  }
}

async function errorOf(p: Promise<unknown>): Promise<VsnapError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(VsnapError);
  return err as VsnapError;
}

describe.skipIf(!run)('a registry reference as a snapshot source', () => {
  let reg: TestRegistry;
  let dir: string;
  let engine: TestEngine;
  let client: EngineClient;
  let registry: RegistryClient;
  let reference: string;
  let answer: number[] | null;
  let pushedId: string;
  const sleeping = async () => (await client.wire.vsnapStatus()).sleeping;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'vsnap-regsrc-'));
    [reg, engine] = await Promise.all([startRegistry(dir), startEngine()]);
    client = new EngineClient({ baseUrl: engine.url, token: engine.token });
    registry = new RegistryClient({ dockerConfig: false, stateDir: join(dir, 'state') });
    // captured on "another machine" (its own store), pushed, and that store is gone
    const origin = await RegionStore.open(tempDir());
    answer = (await askCapital(client, 8)).ids;
    const { snapshot } = await suspendEngine(origin, 'ref', client, { captureIfNeeded: true });
    pushedId = snapshot.id;
    reference = `${reg.prefix}/team/reference:v1`;
    await registry.push(origin, 'ref', reference);
    await reg.mark();
  }, 30_000);
  afterAll(async () => {
    await client?.close();
    await engine?.stop();
    await reg?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('restoreEngine on an empty store pulls it under the ref name, restores the same answer; the second restore makes no registry request', async () => {
    const store = await RegionStore.open(tempDir());
    const report = await restoreEngine({ store, name: 'local', from: { reference, registry } }, client);
    expect(report.path).toBe('restored');
    expect((await askCapital(client, 8)).ids).toEqual(answer);
    expect((await store.current('local'))?.id).toBe(pushedId);
    const pulled = await reg.mark();
    expect(pulled.filter((r) => r.method === 'GET' && r.path.includes('/blobs/')).length).toBeGreaterThan(0);

    await suspendEngine(store, 'local', client); // matches the pulled snapshot: nothing captured
    expect((await store.current('local'))?.id).toBe(pushedId);
    const again = await restoreEngine({ store, name: 'local', from: { reference, registry } }, client);
    expect(again.path).toBe('restored');
    expect((await askCapital(client, 8)).ids).toEqual(answer);
    expect(await reg.mark()).toEqual([]);
    await suspendEngine(store, 'local', client);
  });

  it('a reference the registry lacks: fail throws E_SNAPSHOT_NOT_FOUND with the engine untouched; reload recovers it as missing', async () => {
    const store = await RegionStore.open(tempDir());
    const gone = { store, name: 'local', from: { reference: `${reg.prefix}/team/reference:nope`, registry } };
    expect((await errorOf(restoreEngine(gone, client))).code).toBe('E_SNAPSHOT_NOT_FOUND');
    expect(await sleeping()).toBe(true);
    const report = await restoreEngine(gone, client, { recovery: 'reload', ...quiet });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'missing', code: 'E_SNAPSHOT_NOT_FOUND' } });
    expect((await askCapital(client, 8)).ids).toEqual(answer);
    expect(await store.current('local')).toBeUndefined(); // nothing half-pulled
    await suspendEngine(store, 'other', client, { captureIfNeeded: true });
  });

  it('a registry that does not answer: E_REGISTRY, recovered as missing with reload', async () => {
    const store = await RegionStore.open(tempDir());
    const down = { store, name: 'local', from: { reference: `http://127.0.0.1:${await freePort()}/team/reference:v1`, registry } };
    expect((await errorOf(restoreEngine(down, client))).code).toBe('E_REGISTRY');
    expect(await sleeping()).toBe(true);
    const report = await restoreEngine(down, client, { recovery: 'reload', ...quiet });
    expect(report).toMatchObject({ path: 'recovered', recovery: { reason: 'missing', code: 'E_REGISTRY' } });
    await suspendEngine(store, 'other', client, { captureIfNeeded: true });
  });

  it('vsnap serve with models.<name>.registry pulls the missing snapshot at start-up (logged) and serves the model from it', async () => {
    const storeDir = tempDir();
    const lines: string[] = [];
    const config = parseConfig(
      `listen: { port: 0 }\nstore: ${storeDir}\ngpus: { "0": { budgetGiB: 1 } }\nrecovery: { mode: fail }\n` +
        `models:\n  ref:\n    url: ${engine.url}\n    token: ${engine.token}\n    registry: ${reference}\n    memoryGiB: 0.5\n`,
      'test.yaml',
    );
    expect(config.models.ref!.registry).toBe(reference);
    const handle = await serve(config, { log: (l) => lines.push(l), stateDir: tempDir() });
    await handle.booted;
    try {
      expect(lines.some((l) => /ref: pulled snapshot 'ref' from .*team\/reference:v1/.test(l))).toBe(true);
      expect(lines.some((l) => /ref: pull downloading/.test(l))).toBe(true);
      const store = await RegionStore.open(storeDir);
      expect((await store.current('ref'))?.id).toBe(pushedId);
      await reg.mark();
      await completesThrough(handle.agent.url);
      expect((await askCapital(client, 8)).ids).toEqual(answer);
      expect(lines.some((l) => /restore ref/.test(l))).toBe(true);
      expect(await reg.mark()).toEqual([]); // restored from the local copy
    } finally {
      await handle.close();
      await suspendEngine(await RegionStore.open(storeDir), 'ref', client); // asleep again for the next test
    }
  }, 30_000);

  it('the SwapController pulls a snapshot its store lacks on the first restore (from), restores it (no recovery), then stays local', async () => {
    const store = await RegionStore.open(tempDir());
    const controller = await SwapController.create({ store, engines: [{ name: 'ref', client, memoryBytes: 2 ** 29, from: { reference, registry } }], budgets: { 0: 2 ** 30 } });
    try {
      const events: string[] = [];
      controller.on('swap', (e: { action: string; tier?: string; recovered?: string }) => events.push(`${e.action} ${e.tier}${e.recovered ? ` ${e.recovered}` : ''}`));
      const loads = Number((await client.wire.collectiveRpc('ref_weight_loads'))![0]);
      const lease = await controller.acquire('ref');
      expect((await askCapital(client, 8)).ids).toEqual(answer);
      lease.release();
      expect(events).toEqual(['restore store']);
      expect(controller.states()[0]!.snapshotProblem).toBeUndefined(); // it was missing until the pull
      expect(Number((await client.wire.collectiveRpc('ref_weight_loads'))![0])).toBe(loads); // restored, not reloaded
      expect((await store.current('ref'))?.id).toBe(pushedId);
      expect((await reg.mark()).some((r) => r.path.includes('/blobs/'))).toBe(true);
      expect((await controller.suspend('ref'))!.captured).toBe(false);
      await controller.restore('ref');
      expect(await reg.mark()).toEqual([]);
      await controller.suspend('ref');
    } finally {
      await controller.close();
    }
  });

  it('an artifact of another model is refused before any layer (E_MANIFEST_MISMATCH), and never recovered: reload would load the wrong model', async () => {
    const other = await startEngine({ seed: 2 });
    const otherClient = new EngineClient({ baseUrl: other.url, token: other.token });
    try {
      const origin = await RegionStore.open(tempDir());
      await suspendEngine(origin, 'two', otherClient, { captureIfNeeded: true });
      const two = `${reg.prefix}/team/reference:two`;
      await registry.push(origin, 'two', two);
      await reg.mark();
      const store = await RegionStore.open(tempDir());
      const loads = Number((await client.wire.collectiveRpc('ref_weight_loads'))![0]);
      for (const recovery of ['fail', 'reload'] as const) {
        const err = await errorOf(restoreEngine({ store, name: 'local', from: { reference: two, registry } }, client, { recovery, ...quiet }));
        expect(err.code).toBe('E_MANIFEST_MISMATCH');
        expect(err.message).toMatch(/model/);
      }
      const seen = await reg.mark();
      expect(seen.filter((r) => r.path.includes('/blobs/'))).toHaveLength(2); // the config blob, once per attempt: no layer
      expect(await sleeping()).toBe(true);
      expect(Number((await client.wire.collectiveRpc('ref_weight_loads'))![0])).toBe(loads);
      expect(await store.current('local')).toBeUndefined();
    } finally {
      await otherClient.close();
      await other.stop();
    }
  });

  it('vsnap serve: an engine it starts is suspended against the pulled snapshot at boot (nothing captured)', async () => {
    const port = await freePort();
    const yaml = (store: string, extra: string) =>
      `listen: { port: 0 }\nstore: ${store}\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n  m1:\n    command: node\n` +
      `    args: [examples/quickstart/reference-engine.mjs, --port, "\${PORT}", --seed, "1", --model, m1]\n    port: ${port}\n    token: engine-token-1\n    memoryGiB: 0.6\n${extra}`;
    // the node that captured it: boots, captures at boot, pushes
    const origin = tempDir();
    const first: string[] = [];
    await bootAndClose(serve(parseConfig(yaml(origin, ''), 'a.yaml'), { log: (l) => first.push(l), stateDir: tempDir() }));
    expect(first.some((l) => /m1 is up and suspended \(snapshot captured\)/.test(l))).toBe(true);
    const m1 = `${reg.prefix}/team/m1:v1`;
    const pushed = await registry.push(await RegionStore.open(origin), 'm1', m1);
    // another node: pulls at boot, so nothing is captured
    const lines: string[] = [];
    const storeDir = tempDir();
    const handle = await serve(parseConfig(yaml(storeDir, `    registry: ${m1}\n`), 'b.yaml'), { log: (l) => lines.push(l), stateDir: tempDir() });
    await handle.booted;
    try {
      expect(lines.some((l) => /m1: pulled snapshot 'm1'/.test(l))).toBe(true);
      expect(lines.some((l) => /m1 is up and suspended in/.test(l))).toBe(true); // no "(snapshot captured)"
      expect((await (await RegionStore.open(storeDir)).history('m1')).map((m) => m.id)).toEqual([(await (await RegionStore.open(origin)).current('m1'))!.id]);
      expect(pushed.layers).toBeGreaterThan(0);
    } finally {
      await handle.close();
    }
  }, 30_000);

  it('vsnap serve: a pull that fails at start-up is logged, serve starts, and the model is recovered through its engine', async () => {
    const storeDir = tempDir();
    const lines: string[] = [];
    const down = `http://127.0.0.1:${await freePort()}/team/reference:v1`;
    const config = parseConfig(
      `listen: { port: 0 }\nstore: ${storeDir}\ngpus: { "0": { budgetGiB: 1 } }\nrecovery: { materialize: off }\n` +
        `models:\n  ref:\n    url: ${engine.url}\n    token: ${engine.token}\n    registry: ${down}\n    memoryGiB: 0.5\n`,
      'test.yaml',
    );
    const handle = await serve(config, { log: (l) => lines.push(l), stateDir: tempDir() });
    await handle.booted;
    try {
      expect(lines.some((l) => /ref: pulling snapshot 'ref' from .* failed \(E_REGISTRY\)/.test(l))).toBe(true);
      await completesThrough(handle.agent.url);
      expect(lines.some((l) => /ref recovered through its engine's own loader .*\(missing, E_REGISTRY\)/.test(l))).toBe(true);
      expect((await askCapital(client, 8)).ids).toEqual(answer);
    } finally {
      await handle.close();
      await suspendEngine(await RegionStore.open(storeDir), 'ref', client, { captureIfNeeded: true });
    }
  }, 30_000);

  it('a pull cancelled by the signal is E_ABORTED, never recovered from, and leaves nothing in the store', async () => {
    const store = await RegionStore.open(tempDir());
    for (const recovery of ['fail', 'reload'] as const) {
      const ac = new AbortController();
      const from = { reference, registry, onProgress: () => ac.abort() };
      expect((await errorOf(restoreEngine({ store, name: 'local', from }, client, { recovery, signal: ac.signal, ...quiet }))).code).toBe('E_ABORTED');
    }
    expect(await store.current('local')).toBeUndefined();
    expect(await sleeping()).toBe(true);
  });

  it('vsnap serve reads the CA and credentials of a TLS registry with htpasswd from the environment', async () => {
    const tlsDir = mkdtempSync(join(tmpdir(), 'vsnap-regsrc-tls-'));
    const secure = await startRegistry(tlsDir, { tls: true, auth: 'htpasswd', user: { name: 'bob', password: 'builder' } });
    const saved = { ...process.env };
    try {
      const caFile = join(tlsDir, 'ca.crt'); // written by startRegistry
      const ref = `${secure.prefix}/team/reference:v1`;
      const origin = await RegionStore.open(tempDir());
      await registry.pull(origin, reference, { name: 'ref' }); // the same snapshot, into the secure registry
      await new RegistryClient({ ca: secure.ca!, credentials: { username: 'bob', password: 'builder' }, dockerConfig: false, stateDir: join(tlsDir, 'state') }).push(origin, 'ref', ref);
      const storeDir = tempDir();
      const config = parseConfig(
        `listen: { port: 0 }\nstore: ${storeDir}\ngpus: { "0": { budgetGiB: 1 } }\nrecovery: { mode: fail }\n` +
          `models:\n  ref:\n    url: ${engine.url}\n    token: ${engine.token}\n    registry: ${ref}\n    memoryGiB: 0.5\n`,
        'test.yaml',
      );
      Object.assign(process.env, { VSNAP_REGISTRY_CA: caFile, VSNAP_REGISTRY_USERNAME: 'bob', VSNAP_REGISTRY_PASSWORD: 'builder', DOCKER_CONFIG: join(tlsDir, 'no-docker') });
      const lines: string[] = [];
      await bootAndClose(serve(config, { log: (l) => lines.push(l), stateDir: tempDir() }));
      expect(lines.some((l) => /ref: pulled snapshot 'ref'/.test(l))).toBe(true);
      delete process.env.VSNAP_REGISTRY_PASSWORD; // no credentials: refused, logged, serve still starts
      const failed: string[] = [];
      await bootAndClose(serve({ ...config, store: tempDir() }, { log: (l) => failed.push(l), stateDir: tempDir() }));
      expect(failed.some((l) => /failed \(E_REGISTRY_AUTH\)/.test(l))).toBe(true);
    } finally {
      process.env = saved;
      await secure.close();
      rmSync(tlsDir, { recursive: true, force: true });
    }
  }, 30_000);
});
