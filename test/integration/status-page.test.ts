import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { request } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';

import { cliPath } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

// The status page of `vsnap serve`, in a real browser: Debian's chromium, driven by playwright-core.
// .ci/run installs it; without one this test says so and is skipped, except in CI (CI=true), where it fails.
const chromium = [process.env.VSNAP_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p): p is string => !!p && existsSync(p));
if (!chromium && process.env.CI !== 'true') console.warn('status-page.test.ts: skipped: no Chromium (apt-get install chromium, or set VSNAP_CHROMIUM)');
const ARTIFACTS = join(process.cwd(), 'test-artifacts');
const TOKEN = 'quickstart-control-token';

let serve: ChildProcess | undefined;
afterAll(async () => {
  if (serve && serve.exitCode === null) {
    const exited = new Promise((r) => serve!.once('exit', r));
    serve.kill('SIGTERM');
    await exited;
  }
});

describe.skipIf(!chromium && process.env.CI !== 'true')('the status page of vsnap serve', () => {
  it('loads without console errors, shows both quick-start engines, and updates after a swap (screenshot in test-artifacts/)', async () => {
    expect(chromium, 'CI needs Chromium: .ci/run installs the chromium package').toBeDefined();
    // The quick-start configuration as shipped, on free ports and a temporary store.
    const config = parse(readFileSync('examples/quickstart/serve.yaml', 'utf8')) as {
      listen: { port: number };
      store: string;
      models: Record<string, { port: number }>;
    };
    config.store = join(tempDir(), 'store');
    config.listen.port = await freePort();
    for (const m of Object.values(config.models)) m.port = await freePort();
    const file = join(tempDir(), 'serve.yaml');
    writeFileSync(file, stringify(config));

    serve = spawn(process.execPath, [cliPath, 'serve', '--config', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    const url = await new Promise<string>((resolve, reject) => {
      serve!.stderr!.on('data', (d: Buffer) => {
        log += d.toString();
        const m = /serving .* on (http:\/\/\S+)/.exec(log);
        if (m) resolve(m[1]!);
      });
      serve!.once('exit', (code) => reject(new Error(`vsnap serve exited (${code}):\n${log}`)));
    });

    const { chromium: pw } = await import('playwright-core');
    const browser = await pw.launch({ executablePath: chromium!, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
    try {
      const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
      const problems: string[] = [];
      page.on('console', (m) => {
        if (m.type() === 'error') problems.push(m.text());
      });
      page.on('pageerror', (e) => problems.push(e.message));
      // the control token is set: the page asks for it
      await page.goto(url);
      await page.waitForSelector('#login.show');
      // the only console line so far: the browser's note of the 401 that made the page ask
      expect(problems.every((p) => /401/.test(p)), problems.join('\n')).toBe(true);
      problems.splice(0);
      await page.fill('#token', TOKEN);
      await page.click('#login button');
      for (const name of Object.keys(config.models)) await page.waitForSelector(`tr[data-engine="${name}"]`);
      expect(await page.textContent('#engines')).toMatch(/reference-a.*asleep.*reference-b.*asleep/s);
      expect(await page.textContent('#chart')).toContain('no swaps yet');

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
      expect(await page.textContent('#gpus')).toMatch(/614\.40 MiB awake, 0 B held, 409\.60 MiB free of 1\.00 GiB/);
      expect(await page.textContent('#snapshots')).toMatch(/reference-a.*reference-b/s);
      mkdirSync(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, 'status-page.png'), fullPage: true });
      expect(problems, problems.join('\n')).toEqual([]);
    } finally {
      await browser.close();
    }
    // SIGTERM to vsnap stops it and its engines, with exit code 0
    const exited = new Promise<number | null>((r) => serve!.once('exit', (code) => r(code)));
    serve.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});
