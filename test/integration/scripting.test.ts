import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
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

// The README's SDK example and the tsconfig docs/sdk.md gives, as a user copies them.
const README_EXAMPLE = /## The SDK, on a CPU[\s\S]*?```js\n([\s\S]*?)```/.exec(readFileSync('README.md', 'utf8'))![1]!;
const SDK_TSCONFIG = JSON.parse(/```json\n([\s\S]*?)```/.exec(readFileSync('docs/sdk.md', 'utf8'))![1]!) as unknown;
// Every entry point, used as values and as types; `strict` makes an unresolved module an error, not `any`.
const RESOLVE_CHECK = `import { DeviceAllocation, RegionStore, VsnapError } from 'vsnap';
import { HostRegion, listDevices } from 'vsnap/plumbing';
import { loadConfig, type ServeConfig } from 'vsnap/serve';

export function check(region: HostRegion, config: ServeConfig): Array<string | number | boolean> {
  const fromRoot: typeof DeviceAllocation.allocate = DeviceAllocation.allocate;
  return [region.memory.kind, region.size, typeof RegionStore.open, new VsnapError('E_IO', 'x').code, typeof listDevices, typeof loadConfig, typeof fromRoot, Object.keys(config).length];
}
`;
const RESOLUTIONS: Record<string, { type?: 'module'; compilerOptions: Record<string, unknown> }> = {
  node16: { compilerOptions: { module: 'node16', moduleResolution: 'node16' } },
  nodenext: { type: 'module', compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext' } },
  bundler: { type: 'module', compilerOptions: { module: 'esnext', moduleResolution: 'bundler' } },
  node: { compilerOptions: { module: 'commonjs', moduleResolution: 'node' } }, // classic: subpaths through typesVersions
};

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
  for (const [name, { type, compilerOptions }] of Object.entries(RESOLUTIONS)) {
    const d = join(project, `resolve-${name}`);
    mkdirSync(d);
    writeFileSync(join(d, 'package.json'), JSON.stringify({ name: `resolve-${name}`, private: true, ...(type ? { type } : {}) }));
    writeFileSync(join(d, 'tsconfig.json'), JSON.stringify({ compilerOptions: { target: 'es2022', strict: true, noEmit: true, types: ['node'], ...compilerOptions }, files: ['check.ts'] }));
    writeFileSync(join(d, 'check.ts'), RESOLVE_CHECK);
  }
  // the README example as docs/sdk.md says to run it: an ES module (`.mts` in a CommonJS project, `.ts` where "type" is "module")
  for (const [name, type, file] of [['readme-commonjs', undefined, 'example.mts'], ['readme-esm', 'module', 'example.ts']] as const) {
    const d = join(project, name);
    mkdirSync(d);
    writeFileSync(join(d, 'package.json'), JSON.stringify({ name, private: true, ...(type ? { type } : {}) }));
    writeFileSync(join(d, 'tsconfig.json'), JSON.stringify(SDK_TSCONFIG));
    writeFileSync(join(d, file), README_EXAMPLE);
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

/** The value exports a declaration file declares (type-only exports and types left out), read with the installed TypeScript. */
function declaredValues(file: string): string[] {
  const ts = createRequire(join(project, 'package.json'))('typescript') as typeof import('typescript');
  const program = ts.createProgram([file], { noEmit: true, types: [], module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext });
  const checker = program.getTypeChecker();
  const typeOnly = (s: import('typescript').Symbol) =>
    (s.declarations ?? []).some((d) => (ts.isExportSpecifier(d) && (d.isTypeOnly || d.parent.parent.isTypeOnly)) || ts.isTypeOnlyImportOrExportDeclaration(d));
  const isValue = (symbol: import('typescript').Symbol): boolean => {
    let s = symbol;
    while (s.flags & ts.SymbolFlags.Alias) {
      if (typeOnly(s)) return false;
      s = checker.getImmediateAliasedSymbol(s) ?? checker.getAliasedSymbol(s);
      if (s === symbol) break;
    }
    return (s.flags & ts.SymbolFlags.Value) !== 0;
  };
  const mod = checker.getSymbolAtLocation(program.getSourceFile(file)!)!;
  return checker.getExportsOfModule(mod).filter(isValue).map((s) => s.name).sort();
}

describe('what the packed package declares is what it exports', () => {
  const entries = [['vsnap', 'index'], ['vsnap/plumbing', 'plumbing'], ['vsnap/serve', 'serve/index']] as const;

  it.each(entries)('%s: every declared value exists at run time, and nothing undeclared (import and require)', async (entry, file) => {
    const installed = join(project, 'node_modules', 'vsnap', 'dist');
    const esmDeclared = declaredValues(join(installed, `${file}.d.ts`));
    const cjsDeclared = declaredValues(join(installed, `${file}.d.cts`));
    expect(esmDeclared.length).toBeGreaterThan(0);
    expect(cjsDeclared).toEqual(esmDeclared);
    const env = { ...process.env, NODE_OPTIONS: '' };
    const imported = await run(process.execPath, ['--input-type=module', '-e', `const m = await import(${JSON.stringify(entry)}); console.log(JSON.stringify(Object.keys(m).filter((k) => m[k] !== undefined).sort()))`], { cwd: project, env });
    const required = await run(process.execPath, ['-e', `const m = require(${JSON.stringify(entry)}); console.log(JSON.stringify(Object.keys(m).filter((k) => m[k] !== undefined).sort()))`], { cwd: project, env });
    expect(JSON.parse(imported.stdout) as string[]).toEqual(esmDeclared);
    expect(JSON.parse(required.stdout) as string[]).toEqual(cjsDeclared);
  });

  it('the root declares DeviceAllocation as a class that exists at run time (it once was declared only)', () => {
    expect(declaredValues(join(project, 'node_modules', 'vsnap', 'dist', 'index.d.ts'))).toContain('DeviceAllocation');
  });
});

describe('the subpaths\' types resolve under every moduleResolution', () => {
  it.each(Object.keys(RESOLUTIONS))('%s: tsc --noEmit (strict) of a file using vsnap, vsnap/plumbing and vsnap/serve', async (name) => {
    const result = await run(process.execPath, [join(project, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', '.'], { cwd: join(project, `resolve-${name}`) }).then(
      () => ({ code: 0, stdout: '' }),
      (e: { code: number; stdout: string }) => ({ code: e.code, stdout: e.stdout }),
    );
    expect(result).toEqual({ code: 0, stdout: '' });
  });
});

describe('the README\'s SDK example, saved as TypeScript with the tsconfig of docs/sdk.md', () => {
  const cases = [['readme-commonjs', 'example.mts'], ['readme-esm', 'example.ts']] as const;

  it.each(cases)('%s: type-checks (strict), runs under tsx and ts-node, and leaves nothing in the temporary directory', async (name, file) => {
    const cwd = join(project, name);
    const tsc = await run(process.execPath, [join(project, 'node_modules', 'typescript', 'bin', 'tsc'), '--noEmit', '-p', '.'], { cwd }).then(
      () => '',
      (e: { stdout: string }) => e.stdout,
    );
    expect(tsc).toBe('');
    for (const runner of [[bin('tsx'), file], [process.execPath, '--import', REGISTER_TS_NODE, file]]) {
      const tmp = mkdtempSync(join(dir, 'tmp-'));
      const { stdout } = await run(runner[0]!, runner.slice(1), { cwd, env: { ...process.env, NODE_OPTIONS: '', TMPDIR: tmp } });
      expect(stdout).toMatch(/^restore 2: 100663296 bytes from the ram tier/m);
      expect(stdout).toContain('model.embed_tokens.weight: "contents of model.embed_tokens.weight"');
      expect(readdirSync(tmp).filter((f) => f.startsWith('vsnap-example-'))).toEqual([]);
    }
  });
});
