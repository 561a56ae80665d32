import { execFile } from 'node:child_process';
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';

import { mkdirParents } from '../../src/store/fsutil.js';
import { RegionStore } from '../../src/store/region-store.js';
import { runCli } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

const run = promisify(execFile);

describe('a store path that cannot exist', () => {
  it('RegionStore.open("/proc/...") answers E_STORE_INVALID with the reason at once (Node 20\'s recursive mkdirSync loops there forever)', async () => {
    // in a child: the defect is a synchronous loop, which no test timeout in this process could stop
    const script = `
      const { RegionStore } = await import(${JSON.stringify(new URL('../../src/store/region-store.ts', import.meta.url).href)});
      for (const root of ['/proc/vsnap-store', '/proc/vsnap-a/b']) {
        const err = await RegionStore.open(root).then(() => undefined, (e) => e);
        console.log(JSON.stringify({ root, code: err?.code, message: err?.message }));
      }`;
    const { stdout } = await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { timeout: 120_000, killSignal: 'SIGKILL' });
    const answers = stdout.trim().split('\n').map((l) => JSON.parse(l) as { root: string; code: string; message: string });
    expect(answers.map((a) => a.code)).toEqual(['E_STORE_INVALID', 'E_STORE_INVALID']);
    for (const a of answers) expect(a.message).toMatch(new RegExp(`cannot make the store directory ${a.root}: ENOENT`));
  });

  it('vsnap serve with `store: /proc/...`: exits at once with E_STORE_INVALID, pointing at the configuration', async () => {
    const config = join(tempDir(), 'serve.yaml');
    const yaml = parse(readFileSync('examples/quickstart/serve.yaml', 'utf8')) as { listen: { port: number }; store: string; models: Record<string, { port: number }> };
    yaml.store = '/proc/vsnap-store';
    yaml.listen.port = await freePort(); // serve checks its ports first
    for (const m of Object.values(yaml.models)) m.port = await freePort();
    writeFileSync(config, stringify(yaml));
    const out = await runCli(['serve', '--config', config]);
    expect(out.code).toBe(1);
    expect(out.stderr).toMatch(/\[E_STORE_INVALID\] cannot make the store directory \/proc\/vsnap-store: ENOENT/);
    expect(out.stderr).toMatch(/hint: check the configuration's `store`/);
  });

  it('a file where a parent directory should be: E_STORE_INVALID naming it', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'file'), 'x');
    await expect(RegionStore.open(join(dir, 'file', 'store'))).rejects.toMatchObject({ code: 'E_STORE_INVALID', message: expect.stringMatching(/ENOTDIR/) });
  });

  it('mkdirParents makes every missing directory and returns the first it made, as mkdir -p does', () => {
    const dir = tempDir();
    expect(mkdirParents(join(dir, 'a', 'b', 'c'))).toBe(join(dir, 'a'));
    expect(statSync(join(dir, 'a', 'b', 'c')).isDirectory()).toBe(true);
    expect(mkdirParents(join(dir, 'a', 'b'))).toBeUndefined();
    expect(existsSync(join(dir, 'a', 'b'))).toBe(true);
  });
});
