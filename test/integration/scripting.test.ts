import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// Scripting vsnap in TypeScript (docs/scripting.md), against the packed package as a user
// installs it: one install of the tarball (with --ignore-scripts: the committed prebuild is found
// at load time by node-gyp-build, no install script needed) beside ts-node, TypeScript and tsx at
// the versions of this repository's dev dependencies (so npm ci has them in npm's cache), then
// one script that imports vsnap, run as CommonJS and as an ES module under each runner. The
// script is type-checked by ts-node (its default; once per form: index.d.cts, index.d.ts),
// captures and restores a host region through the native addon, and prints what it saw.

const run = promisify(execFile);
const devVersion = (name: string) => (JSON.parse(readFileSync(`node_modules/${name}/package.json`, 'utf8')) as { version: string }).version;
// Node 20.6+: the loader registered from --import (what `node --loader` now warns to use instead)
const REGISTER_TS_NODE = 'data:text/javascript,import { register } from "node:module"; import { pathToFileURL } from "node:url"; register("ts-node/esm", pathToFileURL("./"));';

const SCRIPT = `import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { RegionStore, Snapshot, VERSION, VsnapError, type RestoreRegion } from 'vsnap';
import { HostRegion } from 'vsnap/plumbing';

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'vsnap-script-'));
  const source = HostRegion.create(1 << 20);
  const target = HostRegion.create(1 << 20);
  try {
    const bytes = Buffer.alloc(1 << 20, 0x5a);
    source.write(0, bytes);
    const store = await RegionStore.open(dir);
    const snap = await Snapshot.capture(store, 'script', { regions: [{ key: 'w', size: source.size, memory: source.memory }] });
    const regions: RestoreRegion[] = [{ key: 'w', size: target.size, memory: target.memory }];
    await snap.restore({ regions });
    const restored: boolean = target.read(0, target.size).equals(bytes);
    const code: string = new VsnapError('E_INVALID_ARGUMENT', 'x').code;
    console.log(JSON.stringify({ version: VERSION, restored, code, module: typeof require === 'function' ? 'commonjs' : 'esm' }));
  } finally {
    source.close();
    target.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
`;
const TSCONFIG = { compilerOptions: { target: 'es2022', module: 'node16', moduleResolution: 'node16', strict: true, types: ['node'] } };

let dir = '';
let project = '';
let esm = '';
const version = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;
const bin = (name: string) => join(project, 'node_modules', '.bin', name);
/** Runs script.ts in `cwd`; `typeCheck: false` for ts-node's other invocations of a form already type-checked (its type-check costs seconds of CPU). */
const runScript = async (cwd: string, command: string, args: string[], { typeCheck = true } = {}) => {
  const env = { ...process.env, NODE_OPTIONS: '', ...(typeCheck ? {} : { TS_NODE_TRANSPILE_ONLY: 'true' }) };
  const { stdout } = await run(command, [...args, 'script.ts'], { cwd, env });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as { version: string; restored: boolean; code: string; module: string };
};

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vsnap-scripting-')); // for the whole file (tempDir() is per test)
  // the built package (npm test builds first); --ignore-scripts: no second build
  const { stdout } = await run('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', dir], { maxBuffer: 64 * 1024 * 1024 });
  const tarball = join(dir, (JSON.parse(stdout) as Array<{ filename: string }>)[0]!.filename);
  project = join(dir, 'project');
  esm = join(project, 'esm');
  mkdirSync(esm, { recursive: true });
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'scripting-commonjs', private: true }));
  writeFileSync(join(esm, 'package.json'), JSON.stringify({ name: 'scripting-esm', private: true, type: 'module' }));
  for (const d of [project, esm]) {
    writeFileSync(join(d, 'tsconfig.json'), JSON.stringify(TSCONFIG));
    writeFileSync(join(d, 'script.ts'), SCRIPT);
  }
  const tools = ['ts-node', 'typescript', 'tsx', '@types/node'].map((n) => `${n}@${devVersion(n)}`);
  await run('npm', ['install', tarball, ...tools, '--ignore-scripts', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: project, maxBuffer: 64 * 1024 * 1024 });
}, 300_000);
afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('a TypeScript script that imports the packed package (installed with --ignore-scripts)', () => {
  const commonjs = { version, restored: true, code: 'E_INVALID_ARGUMENT', module: 'commonjs' };
  const module = { ...commonjs, module: 'esm' };

  it('CommonJS under ts-node (type-checked) and tsx', async () => {
    expect(await runScript(project, bin('ts-node'), [])).toEqual(commonjs);
    expect(await runScript(project, process.execPath, ['--require', 'ts-node/register'], { typeCheck: false })).toEqual(commonjs);
    expect(await runScript(project, bin('tsx'), [])).toEqual(commonjs);
  });

  it('an ES module ("type": "module") under ts-node\'s ESM loader, both ways Node 20 takes it, and tsx', async () => {
    expect(await runScript(esm, process.execPath, ['--import', REGISTER_TS_NODE])).toEqual(module);
    expect(await runScript(esm, process.execPath, ['--loader', 'ts-node/esm'], { typeCheck: false })).toEqual(module);
    expect(await runScript(esm, bin('tsx'), [])).toEqual(module);
  });

  it('`ts-node --esm` cannot run an ES module on Node 20 (ts-node 10 binds its hooks on the main thread; Node 20 runs loaders on their own thread), as docs/scripting.md says', async () => {
    const err = (await run(bin('ts-node'), ['--esm', 'script.ts'], { cwd: esm }).catch((e: unknown) => e)) as { code?: number; stderr?: string };
    expect(err.code).not.toBe(0);
    expect(err.stderr).toMatch(/ERR_UNKNOWN_FILE_EXTENSION/);
  });

  it('the package works without its install script (the prebuild is found at load time); the install script itself builds nothing', async () => {
    const installed = join(project, 'node_modules', 'vsnap');
    expect(existsSync(join(installed, 'build'))).toBe(false);
    // npm rebuild runs the install script (node-gyp-build): it finds the prebuild and compiles nothing
    await run('npm', ['rebuild', 'vsnap', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: project });
    expect(existsSync(join(installed, 'build'))).toBe(false);
    expect(await runScript(project, bin('tsx'), [])).toEqual(commonjs);
  });
});
