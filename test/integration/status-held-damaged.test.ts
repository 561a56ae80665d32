import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';

import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import { GpuTier } from '../../src/cache/gpu-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapAgent } from '../../src/serve/agent.js';
import { SwapController } from '../../src/swap/controller.js';
import type { StatusReport } from '../../src/serve/status/board.js';
import { startEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// The status page shows tier 0 (an engine asleep whose weights stay on the GPU) and a damaged
// snapshot, in /api/status and, with Chromium, on the page (see status-page.test.ts for the browser).
const chromium = [process.env.VSNAP_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p): p is string => !!p && existsSync(p));
const GB = 1e9;
const TOKEN = 'ctl';
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

/** Flips one byte in the middle of the first blob of `name`'s current capture. */
async function corrupt(store: RegionStore, name: string): Promise<void> {
  const region = [...(await Snapshot.open(store, name)).manifest.regions()][0]!.region;
  const path = store.blobPath(region.blob);
  chmodSync(path, 0o644);
  const fd = openSync(path, 'r+');
  const at = Math.floor(region.size / 2);
  const byte = Buffer.alloc(1);
  readSync(fd, byte, 0, 1, at);
  writeSync(fd, Buffer.from([byte[0]! ^ 0xff]), 0, 1, at);
  closeSync(fd);
}

/** Three reference engines with tier 0, room for one awake engine and one holding (13 GB: 10 + 2); each woken once (c last). */
async function setup() {
  const names = ['a', 'b', 'c'];
  const engines = [];
  for (const [i, name] of names.entries()) {
    const e = await startEngine({ seed: i + 1, model: name });
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    cleanup.push(() => e.stop(), () => client.close());
    engines.push({ name, client });
  }
  const store = await RegionStore.open(tempDir());
  const resident = new GpuTier();
  cleanup.push(() => resident.close());
  const controller = await SwapController.create({
    store,
    tiers: { gpu: resident },
    engines: engines.map((x) => ({ name: x.name, client: x.client, memoryBytes: 10 * GB, weightsBytes: 2 * GB })),
    budgets: { 0: 13 * GB },
  });
  cleanup.push(() => controller.close());
  for (const name of names) await controller.restore(name);
  const agent = await SwapAgent.listen({ controller, store, controlToken: TOKEN, budgets: { 0: 13 * GB } });
  cleanup.push(() => agent.close());
  return { store, controller, agent };
}

describe('the status page shows weights held on the GPU and damaged snapshots', () => {
  it('in /api/status, and on the page in Chromium when there is one', async () => {
    const { store, controller, agent } = await setup();
    // c is awake now; b was suspended to make room, its weights kept in tier 0; a's were released
    const view = (n: string) => controller.states().find((s) => s.name === n)!;
    expect(view('c')).toMatchObject({ state: 'awake' });
    expect(view('b')).toMatchObject({ state: 'asleep', weightsHeldBytes: 2 * GB });
    expect(view('a').state).toBe('asleep');
    for (const n of ['a', 'c']) expect(view(n).weightsHeldBytes).toBeUndefined();
    // a's snapshot is damaged: a verify finds it and marks it
    await corrupt(store, 'a');
    expect((await controller.verifySnapshot('a')).ok).toBe(false);

    const r = await request(`${agent.url}/api/status`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(r.statusCode).toBe(200);
    const status = (await r.body.json()) as StatusReport;
    const engine = (n: string) => status.engines.find((e) => e.name === n)!;
    expect(engine('b')).toMatchObject({ state: 'asleep', weightsHeldBytes: 2 * GB });
    expect(engine('a')).toMatchObject({ state: 'asleep', snapshotProblem: expect.stringMatching(/failed verification/) });
    expect(engine('c').snapshotProblem).toBeUndefined();
    expect(status.gpus).toEqual([{ device: 0, budgetBytes: 13 * GB, awakeBytes: 10 * GB, heldBytes: 2 * GB, usedBytes: 12 * GB }]);
    const snapshot = (n: string) => status.snapshots.find((s) => s.name === n)!;
    expect(snapshot('a')).toMatchObject({ damaged: true, reason: expect.stringMatching(/failed verification: 1 problem/) });
    expect(snapshot('b').damaged).toBeUndefined();

    if (!chromium) {
      if (process.env.CI === 'true') throw new Error('CI needs Chromium: .ci/run installs the chromium package');
      console.warn('status-held-damaged.test.ts: the page part skipped: no Chromium');
      return;
    }
    const { chromium: pw } = await import('playwright-core');
    const browser = await pw.launch({ executablePath: chromium, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
    try {
      const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
      const problems: string[] = [];
      page.on('pageerror', (e) => problems.push(e.message));
      await page.addInitScript(`sessionStorage.setItem('vsnap-token', ${JSON.stringify(TOKEN)})`); // the token the login form would store
      await page.goto(agent.url);
      await page.waitForSelector('tr[data-snapshot="a"]');
      expect(await page.textContent('tr[data-engine="b"]')).toMatch(/weights held on the GPU\s*1\.86 GiB/);
      expect(await page.textContent('tr[data-engine="a"]')).not.toMatch(/held/);
      expect(await page.textContent('tr[data-engine="c"]')).toMatch(/awake/);
      expect(await page.textContent('tr[data-engine="a"]')).toMatch(/snapshot damaged.*failed verification/);
      expect(await page.textContent('tr[data-snapshot="a"]')).toMatch(/damaged.*failed verification: 1 problem/);
      expect(await page.textContent('tr[data-snapshot="b"]')).toMatch(/durable/);
      expect(await page.textContent('#gpus')).toMatch(/9\.31 GiB awake, 1\.86 GiB held/);
      mkdirSync(join(process.cwd(), 'test-artifacts'), { recursive: true });
      await page.screenshot({ path: join(process.cwd(), 'test-artifacts', 'status-held-damaged.png'), fullPage: true });
      expect(problems, problems.join('\n')).toEqual([]);
    } finally {
      await browser.close();
    }
  });
});
