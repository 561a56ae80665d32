import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { Browser, Page } from 'playwright-core';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';

import { cliPath } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';

// The status page of `vsnap serve`, in a real browser: Debian's chromium, driven by playwright-core.
// .ci/run installs it; without one this test says so and is skipped, except in CI (CI=true), where it fails.
// Screenshots (1280 and 390 px wide) go to test-artifacts/ (or $VSNAP_ARTIFACTS).
const chromium = [process.env.VSNAP_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p): p is string => !!p && existsSync(p));
if (!chromium && process.env.CI !== 'true') console.warn('status-page.test.ts: skipped: no Chromium (apt-get install chromium, or set VSNAP_CHROMIUM)');
const ARTIFACTS = process.env.VSNAP_ARTIFACTS ?? join(process.cwd(), 'test-artifacts');
const TOKEN = 'quickstart-control-token';
const WIDTHS = [1280, 390] as const;

let serve: ChildProcess | undefined;
let browser: Browser | undefined;
let url = '';
let models: string[] = [];
let dir: string | undefined; // for the whole file (the helpers' tempDir() is removed after each test)

/** The quick-start configuration as shipped, on free ports and a temporary store, run by the real CLI. */
async function startServe(): Promise<void> {
  const config = parse(readFileSync('examples/quickstart/serve.yaml', 'utf8')) as { listen: { port: number }; store: string; models: Record<string, { port: number }> };
  dir = mkdtempSync(join(tmpdir(), 'vsnap-status-page-'));
  config.store = join(dir, 'store');
  config.listen.port = await freePort();
  for (const m of Object.values(config.models)) m.port = await freePort();
  models = Object.keys(config.models);
  const file = join(dir, 'serve.yaml');
  writeFileSync(file, stringify(config));
  serve = spawn(process.execPath, [cliPath, 'serve', '--config', file], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  url = await new Promise<string>((resolve, reject) => {
    serve!.stderr!.on('data', (d: Buffer) => {
      log += d.toString();
      const m = /serving .* on (http:\/\/\S+)/.exec(log);
      if (m) resolve(m[1]!);
    });
    serve!.once('exit', (code) => reject(new Error(`vsnap serve exited (${code}):\n${log}`)));
  });
}

async function screenshot(page: Page, name: string): Promise<void> {
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, name), fullPage: true });
}

const PROBE = join(process.cwd(), 'test/helpers/layout-probe.js');
interface Table { id: string; scrolls: string; headers: number; cells: Array<{ text: string; width: number; cut: boolean }>; lastRight: number; boxRight: number }
const probe = <T>(page: Page, call: string): Promise<T> => page.evaluate(`window.layoutProbe.${call}`) as Promise<T>;

afterAll(async () => {
  await browser?.close();
  if (serve && serve.exitCode === null) {
    const exited = new Promise((r) => serve!.once('exit', r));
    serve.kill('SIGTERM');
    await exited;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe.skipIf(!chromium && process.env.CI !== 'true')('the status page of vsnap serve', () => {
  beforeAll(async () => {
    expect(chromium, 'CI needs Chromium: .ci/run installs the chromium package').toBeDefined();
    await startServe();
    const { chromium: pw } = await import('playwright-core');
    browser = await pw.launch({ executablePath: chromium!, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  });

  it('asks for the token, says so visibly when one is refused, shows both quick-start engines, and updates after a swap', async () => {
    const page = await browser!.newPage({ viewport: { width: 1280, height: 900 } });
    const problems: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error') problems.push(m.text());
    });
    page.on('pageerror', (e) => problems.push(e.message));
    // the control token is set: the page asks for it
    const response = await page.goto(url);
    // no page of another site can frame it
    expect(response!.headers()['content-security-policy']).toContain("frame-ancestors 'none'");
    expect(response!.headers()['x-frame-options']).toBe('DENY');
    await page.waitForSelector('#login.show');
    // before a token: the form alone, no empty section headings
    expect(await page.isVisible('main')).toBe(false);
    expect(await page.isVisible('text=GPU budgets')).toBe(false);
    // a wrong token: the page says so where the user looks (not only the browser console's 401)
    await page.fill('#token', 'not-the-token');
    await page.click('#login button');
    await page.locator('#login-error', { hasText: 'refused' }).waitFor({ state: 'visible' });
    await screenshot(page, 'status-page-wrong-token.png');
    expect(await page.isVisible('#login')).toBe(true);
    expect(await page.textContent('#login-error')).toMatch(/the agent refused this token \(401\)/);
    // the only console lines so far: the browser's notes of the 401s
    expect(problems.every((p) => /401/.test(p)), problems.join('\n')).toBe(true);
    problems.splice(0);

    await page.fill('#token', TOKEN);
    await page.click('#login button');
    for (const name of models) await page.waitForSelector(`tr[data-engine="${name}"]`);
    expect(await page.isVisible('main')).toBe(true);
    expect(await page.isVisible('#login')).toBe(false);
    expect(await page.isVisible('#login-error')).toBe(false);
    expect(await page.textContent('#engines')).toMatch(/reference-a.*asleep.*reference-b.*asleep/s);
    expect(await page.textContent('#chart')).toContain('no swaps yet');
    // the labels say what they count
    const row = (await page.textContent('tr[data-engine="reference-a"]'))!;
    // (what an asleep engine keeps on the GPU is not "held": that word is for weights kept in tier 0)
    expect(row).toContain('0 B on GPU asleep');
    expect(row).toContain('0 requests in flight');
    expect(row).toContain('0 waiting');

    // a request for reference-b wakes it: the page shows the swap without a reload
    const r = await request(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'reference-b', prompt: 'The capital of France is', max_tokens: 4 }),
    });
    expect(r.statusCode).toBe(200);
    await r.body.dump();
    await page.locator('#chart', { hasText: 'restore reference-b' }).waitFor();
    await page.locator('tr[data-engine="reference-b"]', { hasText: 'awake' }).waitFor();
    expect(await page.textContent('#gpus')).toMatch(/614\.40 MiB awake, 0 B held by asleep engines, 409\.60 MiB free of 1\.00 GiB/);
    expect(await page.textContent('#snapshots')).toMatch(/reference-a.*reference-b/s);
    // each snapshot's stored bytes beside its size (raw here: 1.00x), and the same in the metrics
    expect(await page.textContent('tr[data-snapshot="reference-a"]')).toMatch(/(\d+\.\d\d \S+)\1 \(1\.00x\)/);
    const metrics = await (await request(`${url}/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } })).body.text();
    const gauge = (form: string) => Number(new RegExp(`^vsnap_snapshot_bytes\\{snapshot="reference-a",form="${form}"\\} (\\d+)$`, 'm').exec(metrics)?.[1]);
    expect(gauge('raw')).toBeGreaterThan(0);
    expect(gauge('stored')).toBe(gauge('raw'));
    await screenshot(page, 'status-page.png');
    expect(problems, problems.join('\n')).toEqual([]);
    await page.close();
  });

  it('at 1280 and 390 px: nothing runs out of its box, every phase has its own colour, tables keep every column (a report with slow, overlapped and failed swaps)', async () => {
    // The agent's real report, with swaps of every kind added: the page is drawn from it alone
    // (its two routes answered from it), so what is measured does not depend on when swaps happen.
    const real = (await (await request(`${url}/api/status`, { headers: { authorization: `Bearer ${TOKEN}` } })).body.json()) as Record<string, unknown> & { swaps: unknown[]; engines: Array<Record<string, unknown>> };
    const at = Date.parse('2026-12-01T12:00:00Z');
    const many = ['validate', 'awaitRoom', 'map', 'restore', 'digest', 'wakeWeights', 'wakeKvCache', 'expectedResponse', 'resetPrefixCache', 'adoptWeights', 'hydrate', 'unlock', 'deep.checkpoint'];
    const report = {
      ...real,
      engines: real.engines.map((e, i) => (i === 0 ? { ...e, state: 'asleep', weightsHeldBytes: 512 * 2 ** 20, leases: 0, waiting: 3 } : e)),
      swaps: [
        ...real.swaps,
        // slow, with overlapped phases that add up to more than the whole swap
        { at, engine: 'reference-a', action: 'restore', ok: true, seconds: 12.345, tier: 'neighbour', phases: Object.fromEntries(many.map((p, i) => [p, 0.4 + i * 0.3])) },
        { at: at + 1000, engine: 'reference-b', action: 'suspend', ok: true, seconds: 0.153, phases: { sleep: 0.1, releaseKvCache: 0.05 } },
        { at: at + 2000, engine: 'reference-a-with-a-rather-long-model-name-to-see-where-it-ends', action: 'restore', ok: true, seconds: 9.87, tier: 'store', phases: { map: 2, restore: 7.5, digest: 0.37 } },
        { at: at + 3000, engine: 'reference-b', action: 'restore', ok: false, error: "'reference-b' could not be given room: suspending 'reference-a' failed (E_IO): ENOENT: no such file or directory, statfs '/var/lib/vsnap-something/long/path'. Retry later." },
      ],
    };
    const body = JSON.stringify(report);
    for (const width of WIDTHS) {
      const page = await browser!.newPage({ viewport: { width, height: 900 } });
      await page.route('**/api/status', (route) => route.fulfill({ status: 200, contentType: 'application/json', body }));
      await page.route('**/api/events', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream', body: `event: status\ndata: ${body}\n\n` }));
      await page.goto(url);
      await page.locator('#chart', { hasText: 'failed' }).waitFor();
      await screenshot(page, `status-page-${width}.png`);

      await page.addScriptTag({ path: PROBE });
      // nothing sticks out of its box, no label is cut without its full text in a title
      expect(await probe<string[]>(page, "overflows('main')"), `at ${width} px`).toEqual([]);
      // the page itself never scrolls sideways: wide tables scroll inside their own box
      expect(await page.evaluate('document.documentElement.scrollWidth')).toBeLessThanOrEqual(width);
      // every swap's duration label is whole and inside the chart
      const values = await probe<Array<{ text: string; cut: boolean; right: number; box: number }>>(page, 'values()');
      expect(values.length).toBeGreaterThanOrEqual(3);
      for (const v of values) {
        expect(v.cut, v.text).toBe(false);
        expect(v.right, v.text).toBeLessThanOrEqual(v.box + 1);
      }
      expect(values.map((v) => v.text)).toContain('12345 ms from neighbour');

      // one colour per phase: legend entries distinct, and every bar segment coloured as its legend entry
      const legend = await probe<Array<{ phase: string; color: string }>>(page, "colours('#phases [data-phase]')");
      const phases = [...many, 'sleep', 'releaseKvCache', 'map', 'restore', 'digest', ...real.swaps.flatMap((s) => Object.keys((s as { phases?: object }).phases ?? {}))];
      expect(legend.map((l) => l.phase).sort()).toEqual([...new Set(phases)].sort());
      expect(new Set(legend.map((l) => l.color)).size).toBe(legend.length);
      const byPhase = new Map(legend.map((l) => [l.phase, l.color]));
      const segments = await probe<Array<{ phase: string; color: string }>>(page, "colours('#chart [data-phase]')");
      expect(segments.length).toBeGreaterThan(legend.length);
      for (const s of segments) expect(s.color, s.phase).toBe(byPhase.get(s.phase));

      // every table keeps all its columns: each header cell is there, whole, and reachable by scrolling its own box
      const tables = await probe<Table[]>(page, 'tables()');
      expect(tables.map((t) => [t.id, t.headers])).toEqual([['engines', 8], ['gpus', 0], ['snapshots', 7]]);
      for (const t of tables) {
        expect(t.scrolls, t.id).toBe('auto');
        for (const c of t.cells) {
          expect(c.width, `${t.id}: ${c.text}`).toBeGreaterThan(0);
          expect(c.cut, `${t.id}: ${c.text}`).toBe(false);
        }
        expect(t.lastRight, `${t.id}: its last column, scrolled to`).toBeLessThanOrEqual(t.boxRight + 1);
      }
      // at 1280 px the engines table fits its box (the process column wraps, nothing to scroll to);
      // at every width the GPU budget text is whole in view, never behind a scroll
      const fits = (sel: string) => page.evaluate(`(() => { const b = document.querySelector(${JSON.stringify(sel)}).closest('.scroll'); return b.scrollWidth - b.clientWidth; })()`) as Promise<number>;
      if (width === 1280) expect(await fits('#engines'), 'engines table at 1280 px').toBeLessThanOrEqual(1);
      expect(await fits('#gpus'), `GPU budgets at ${width} px`).toBeLessThanOrEqual(1);
      // pointing at a phase in the legend dims the others in the bars
      await page.hover('#phases [data-phase="restore"]');
      const dimmed = await page.evaluate(`[...document.querySelectorAll('#chart [data-phase]')].map((e) => [e.dataset.phase, getComputedStyle(e).opacity])`) as Array<[string, string]>;
      expect(dimmed.filter(([p]) => p === 'restore').every(([, o]) => o === '1')).toBe(true);
      expect(dimmed.filter(([p]) => p !== 'restore').every(([, o]) => Number(o) < 0.5)).toBe(true);
      await screenshot(page, `status-page-${width}-legend.png`);
      await page.mouse.move(0, 0);
      // the engines table at this width, scrolled to its last column, in a picture too
      await screenshot(page, `status-page-${width}-scrolled.png`);
      await page.close();
    }
  });

  it('a report with markup in its numeric fields is shown as text: nothing runs, no element is made from it', async () => {
    const real = (await (await request(`${url}/api/status`, { headers: { authorization: `Bearer ${TOKEN}` } })).body.json()) as Record<string, unknown> & { engines: Array<Record<string, unknown>>; gpus: Array<Record<string, unknown>>; snapshots: Array<Record<string, unknown>> };
    const x = (f: string) => `<img src=x onerror="window.pwned=(window.pwned||[]).concat('${f}')">`;
    const report = {
      ...real,
      engines: real.engines.map((e) => ({ ...e, devices: [x('devices')], leases: x('leases'), waiting: x('waiting'), memoryBytes: x('memoryBytes'), asleepBytes: x('asleepBytes'), process: { status: 'running', pid: x('pid') } })),
      gpus: real.gpus.map((g) => ({ ...g, device: x('device'), awakeBytes: x('awakeBytes'), heldBytes: 1, budgetBytes: x('budgetBytes') })),
      snapshots: real.snapshots.map((s) => ({ ...s, versions: x('versions'), bytes: x('bytes'), storedBytes: x('storedBytes') })),
      swaps: [{ at: Date.now(), engine: 'reference-a', action: 'restore', ok: true, seconds: x('seconds'), phases: { map: 0.1 } }],
    };
    const body = JSON.stringify(report);
    const page = await browser!.newPage({ viewport: { width: 1280, height: 900 } });
    await page.route('**/api/status', (route) => route.fulfill({ status: 200, contentType: 'application/json', body }));
    await page.route('**/api/events', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream', body: `event: status\ndata: ${body}\n\n` }));
    await page.goto(url);
    await page.locator('#engines', { hasText: 'onerror' }).waitFor();
    expect(await page.evaluate('window.pwned')).toBeUndefined();
    expect(await page.locator('main img').count()).toBe(0);
    expect(await page.textContent('#engines')).toContain('<img src=x');
    await page.close();
  });

  it('SIGTERM to vsnap stops it and its engines, with exit code 0', async () => {
    const exited = new Promise<number | null>((r) => serve!.once('exit', (code) => r(code)));
    serve!.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});
