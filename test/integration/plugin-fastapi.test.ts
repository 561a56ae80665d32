import { execFileSync } from 'node:child_process';

import { afterEach, describe, expect, it } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { engineControl } from '../../src/engine/control.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { exportRegions } from '../../src/engine/export.js';
import { VsnapError } from '../../src/errors.js';
import { restoreEngine, suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { askCapital, startEngine, type EngineOptions, type TestEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// The plugin on vLLM's web stack (issue 22): the reference engine serves a FastAPI app on uvicorn,
// built as vLLM main's build_app builds it (endpoint plugin from its entry point, attach_router,
// init_state), and every /vsnap/v1 route is driven over real HTTP through the SDK's EngineClient.
// Under FastAPI an unannotated `request` parameter was a required query field: every route 422'd.

const fastapi = (() => {
  try {
    execFileSync('python3', ['-c', 'import fastapi, uvicorn'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
// CI installs FastAPI (.ci/run sets VSNAP_REQUIRE_FASTAPI=1): there, its absence fails every test here.
const required = process.env.VSNAP_REQUIRE_FASTAPI === '1';

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

async function engine(options: EngineOptions = {}) {
  const e = await startEngine({ ...options, env: { VSNAP_REF_HTTP: 'fastapi', ...(options.env ?? {}) } });
  const client = new EngineClient({ baseUrl: e.url, token: e.token });
  running.push(e, client);
  return { e, client };
}

const ask = async (client: EngineClient) => (await askCapital(client, 8)).ids;
const code = (err: unknown) => (err instanceof VsnapError ? `${err.code} ${String(err.details.status ?? '')}`.trim() : String(err));

describe.skipIf(!fastapi && !required)('the /vsnap/v1 routes under FastAPI and uvicorn', () => {
  it('is served by uvicorn', async () => {
    const { e } = await engine({ devMode: false });
    const r = await fetch(`${e.url}/health`);
    expect(r.status).toBe(200);
    expect(r.headers.get('server')).toBe('uvicorn');
  });

  it('every route: status, export, sleep, wake with and without adopt, reset_prefix_cache, release_kv_cache, reload_weights', async () => {
    const { client } = await engine({ devMode: false }); // no dev routes: the plugin's routes alone
    const before = await ask(client);
    const status = await client.wire.vsnapStatus();
    expect(status.routes?.mechanism).toBe('endpoint_plugins');
    expect(status.ranks[0]!.frontend).toBe('python');

    const { control } = await engineControl(client);
    expect(control.via).toBe('vsnap');
    const exported = await exportRegions(control, status.ranks.length);
    expect(exported.ranks[0]!.regions.length).toBe(status.ranks[0]!.regions);
    exported.close();

    await client.wire.vsnapResetPrefixCache();
    await client.wire.vsnapReleaseKvCache();
    expect((await client.wire.vsnapStatus()).ranks[0]!.asleepTags).toEqual(['kv_cache']);
    await client.wire.vsnapWake({ tags: ['kv_cache'] });
    expect(await ask(client)).toEqual(before);

    await client.wire.vsnapSleep({ level: 2 });
    expect((await client.wire.vsnapStatus()).sleeping).toBe(true);
    await client.wire.vsnapWake({ tags: ['weights'] });
    await client.wire.vsnapReloadWeights();
    await client.wire.vsnapWake({ tags: ['kv_cache'] });
    expect(await ask(client)).toEqual(before);

    // wake with adopt: tier 0, the SDK holding the weights while the engine sleeps
    const store = await RegionStore.open(tempDir());
    const resident = new GpuTier();
    try {
      const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true, tiers: { gpu: resident } });
      const report = await restoreEngine(s.snapshot, client, { tiers: { gpu: resident } });
      expect(report.tier).toBe('gpu');
    } finally {
      resident.close();
    }
    expect(await ask(client)).toEqual(before);
  });

  it('a missing or wrong token is refused, bad bodies are 400, an engine call that raises is a 500 saying why', async () => {
    const { e, client } = await engine({ devMode: false });
    for (const token of [undefined, 'wrong']) {
      const other = new EngineClient({ baseUrl: e.url, ...(token ? { token } : {}) });
      running.push(other);
      expect(code(await other.wire.vsnapStatus().catch((x: unknown) => x))).toBe('E_ENGINE_HTTP 401');
      expect(code(await other.wire.vsnapSleep({ level: 2 }).catch((x: unknown) => x))).toBe('E_ENGINE_HTTP 401');
    }
    expect((await client.wire.vsnapStatus()).sleeping).toBe(false); // nothing reached the engine
    for (const [path, body] of [
      ['/vsnap/v1/sleep', '{nope'],
      ['/vsnap/v1/sleep', '{"level": 7}'],
      ['/vsnap/v1/wake', '{"tags": "weights"}'],
      ['/vsnap/v1/export', '{"socket": 3}'],
      ['/vsnap/v1/release_kv_cache', '{"queued": "keep"}'],
    ] as const) {
      const r = await fetch(e.url + path, { method: 'POST', body, headers: { authorization: `Bearer ${e.token}`, 'content-type': 'application/json' } });
      expect(r.status, `${path} ${body}`).toBe(400);
      expect(((await r.json()) as { error: string }).error).toBeTruthy();
    }
    await client.wire.vsnapSleep({ level: 2 });
    const err = await client.wire.vsnapExport({ socket: '/tmp/none.sock', nonces: ['n'.repeat(64)] }).catch((x: unknown) => x);
    expect(code(err)).toBe('E_ENGINE_HTTP 500');
    expect((err as Error).message).toMatch(/the weights are asleep/);
  });

  it('older vLLM: the wrapped build_app, under FastAPI too', async () => {
    const { client } = await engine({ devMode: false, env: { VSNAP_REF_LEGACY_APP: '1' } });
    expect((await client.wire.vsnapStatus()).routes?.mechanism).toBe('build_app wrap');
    const before = await ask(client);
    const store = await RegionStore.open(tempDir());
    const s = await suspendEngine(store, 'ref', client, { captureIfNeeded: true });
    await restoreEngine(s.snapshot, client);
    expect(await ask(client)).toEqual(before);
  });
});

it.runIf(required)('CI has FastAPI and uvicorn (VSNAP_REQUIRE_FASTAPI=1)', () => {
  expect(fastapi).toBe(true);
});
