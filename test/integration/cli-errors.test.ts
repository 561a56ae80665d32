import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { cudaStatus } from '../../src/gpu/cuda.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { runCli } from '../helpers/cli.js';
import { startEngine, type TestEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// Every command's error output, in the command line's own terms: human (stderr: `[CODE] message`
// and a `hint:` line) and --json (one object with code, message and hint on stdout), exit codes.
const SDK_TERMS = /captureIfNeeded|EngineClientOptions|create: true|Snapshot\.captureEngine|run `?vsnap verify/;
const DEAD = 'http://127.0.0.1:9'; // nothing listens on the discard port

let engine: TestEngine;
beforeAll(async () => {
  engine = await startEngine();
});
afterAll(async () => {
  await engine?.stop();
});

interface Case {
  args: string[];
  env?: Record<string, string>;
  code: string;
  exit: number;
  message?: RegExp;
  hint: RegExp;
  /** It logs on stderr before it fails (vsnap serve's engine lines), --json or not. */
  logs?: boolean;
}

async function expectError(c: Case): Promise<void> {
  const env = { VSNAP_STORE: '', VSNAP_ENGINE_URL: '', VSNAP_TOKEN: '', VSNAP_CONTROL_TOKEN: '', VSNAP_AGENT_URL: '', ...(c.env ?? {}) };
  const human = await runCli(c.args, env);
  expect(human.code, `${c.args.join(' ')}: ${human.stderr}`).toBe(c.exit);
  expect(human.stderr).toMatch(c.code === 'E_USAGE' ? /^vsnap: |error: / : new RegExp(`\\[${c.code}\\]`));
  expect(human.stderr).toMatch(c.code === 'E_USAGE' ? /hint: |--help/ : /\nhint: /);
  expect(human.stderr + human.stdout).not.toMatch(SDK_TERMS);
  const json = await runCli([...c.args, '--json'], env);
  expect(json.code).toBe(c.exit);
  const body = JSON.parse(json.stdout) as { ok: boolean; code: string; message: string; hint: string };
  expect(body).toMatchObject({ ok: false, code: c.code });
  expect(body.hint).toMatch(c.hint);
  if (c.message) expect(body.message).toMatch(c.message);
  expect(json.stdout).not.toMatch(SDK_TERMS);
  if (!c.logs) expect(json.stderr).toBe('');
}

describe('error output of every command', () => {
  it('store commands: ls, verify, rm, gc, restore without a store or snapshot; bad names and an empty --store are usage errors', async () => {
    const absent = join(tempDir(), 'absent');
    for (const cmd of [['ls'], ['verify', 'x'], ['rm', 'x'], ['gc']]) {
      await expectError({ args: [...cmd, '--store', absent], code: 'E_STORE_INVALID', exit: 1, hint: /--store/ });
    }
    expect(existsSync(absent)).toBe(false); // none of them made it
    const store = join(tempDir(), 'store');
    (await RegionStore.open(store)).toString();
    await expectError({ args: ['verify', 'nope', '--store', store], code: 'E_SNAPSHOT_NOT_FOUND', exit: 1, hint: /vsnap ls --all/ });
    await expectError({ args: ['rm', 'nope', '--store', store], code: 'E_SNAPSHOT_NOT_FOUND', exit: 1, hint: /vsnap ls --all/ });
    await expectError({ args: ['restore', 'nope', '--store', store, '--engine', engine.url], env: { VSNAP_TOKEN: engine.token }, code: 'E_SNAPSHOT_NOT_FOUND', exit: 1, hint: /vsnap snapshot/ });
    await expectError({ args: ['verify', '../etc', '--store', store], code: 'E_USAGE', exit: 2, message: /invalid snapshot name/, hint: /vsnap verify --help/ });
    await expectError({ args: ['ls', '--store', ''], code: 'E_USAGE', exit: 2, message: /--store needs a directory/, hint: /vsnap ls --help/ });
    await expectError({ args: ['frobnicate'], code: 'E_USAGE', exit: 2, message: /unknown command/, hint: /^see `vsnap --help`$/ });
    await expectError({ args: ['demo', '--size', 'lots'], code: 'E_USAGE', exit: 2, message: /--size/, hint: /vsnap demo --help/ });
  });

  it('engine commands speak of --engine, --token and --capture', async () => {
    const store = join(tempDir(), 'store');
    await expectError({ args: ['status'], code: 'E_USAGE', exit: 2, message: /needs --engine/, hint: /vsnap status --help/ });
    await expectError({ args: ['snapshot', 'x', '--store', store], code: 'E_USAGE', exit: 2, message: /needs --engine/, hint: /snapshot --help/ });
    await expectError({ args: ['status', '--engine', DEAD], code: 'E_ENGINE_UNREACHABLE', exit: 1, hint: /--engine/ });
    await expectError({ args: ['snapshot', 'x', '--engine', DEAD, '--store', store], code: 'E_ENGINE_UNREACHABLE', exit: 1, hint: /--engine/ });
    await expectError({ args: ['status', '--engine', engine.url, '--token', 'wrong'], code: 'E_ENGINE_HTTP', exit: 1, message: /401.*--token/, hint: /--token/ });
    await expectError({
      args: ['suspend', 'ref', '--store', store, '--engine', engine.url],
      env: { VSNAP_TOKEN: engine.token },
      code: 'E_NOT_RESTORABLE',
      exit: 1,
      message: /pass --capture/,
      hint: /--capture/,
    });
    // an --engine (or $VSNAP_ENGINE_URL) that is not an http(s) URL is a usage error, with the option named
    for (const bad of ['notaurl', 'ftp://127.0.0.1:8000', 'http://', '127.0.0.1:8000']) {
      await expectError({ args: ['status', '--engine', bad], code: 'E_USAGE', exit: 2, message: /--engine must be an http\(s\) URL/, hint: /vsnap status --help/ });
    }
    await expectError({ args: ['snapshot', 'x', '--store', store, '--engine', 'nope'], code: 'E_USAGE', exit: 2, message: /--engine must be/, hint: /snapshot --help/ });
    await expectError({ args: ['status'], env: { VSNAP_ENGINE_URL: 'nope' }, code: 'E_USAGE', exit: 2, message: /\$VSNAP_ENGINE_URL must be/, hint: /status --help/ });
    const doctor = await runCli(['doctor', '--engine', DEAD, '--store', store, '--json'], { VSNAP_STORE: '' });
    expect(doctor.code).toBe(1);
    expect(JSON.parse(doctor.stdout)).toMatchObject({ engine: { ok: false, url: DEAD } });
  });

  it('registry commands: a malformed reference is bad usage (exit 2) with the format and a hint, before any store is made', async () => {
    const absent = join(tempDir(), 'absent');
    await expectError({ args: ['pull', 'nosuch', '--store', absent], code: 'E_USAGE', exit: 2, message: /"nosuch" is not a registry reference.*<registry>\/<repo>:<tag>/, hint: /vsnap pull --help/ });
    await expectError({ args: ['pull', 'registry.example.com/Team/m:v1', '--store', absent], code: 'E_USAGE', exit: 2, message: /not a valid repository name/, hint: /vsnap pull --help/ });
    await expectError({ args: ['push', 'm', 'nosuch', '--store', absent], code: 'E_USAGE', exit: 2, message: /not a registry reference/, hint: /vsnap push --help/ });
    expect(existsSync(absent)).toBe(false);
  });

  it('a setting the environment holds that it does not accept: E_CONFIG naming the variable, pointing at the reference', async () => {
    const store = join(tempDir(), 'store');
    const host = HostRegion.create(4096);
    try {
      await Snapshot.capture(await RegionStore.open(store, { create: true }), 'm', { regions: [{ key: 'w', size: 4096, memory: host.memory }] });
    } finally {
      host.close();
    }
    await expectError({
      args: ['verify', 'm', '--store', store],
      env: { VSNAP_STAGING_IDLE_MS: '30s' },
      code: 'E_CONFIG',
      exit: 1,
      message: /\$VSNAP_STAGING_IDLE_MS is "30s": it accepts a whole number of milliseconds/,
      hint: /environment variable .*docs\/configuration\.md/,
    });
  });

  it('serve, swap and bench', async () => {
    const dir = tempDir();
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'store: /tmp/x\ngpus: {}\nmodels: {}\n');
    await expectError({ args: ['serve', '--config', bad], code: 'E_CONFIG', exit: 1, message: /bad\.yaml/, hint: /--config/ });
    await expectError({ args: ['serve', '--config', join(dir, 'missing.yaml')], code: 'E_CONFIG', exit: 1, hint: /--config/ });
    await expectError({ args: ['serve'], code: 'E_USAGE', exit: 2, message: /--config/, hint: /serve --help/ });
    // an engine command that is not there: named with its model, pointing at `command:` (not an exit code and `vsnap status`)
    const engineConfig = (model: string): string => `listen: { port: 0 }\nstore: ${join(dir, 'store')}\ngpus:\n  "0": { budgetGiB: 1 }\nmodels:\n  m:\n${model}    port: ${String(49152 + (process.pid % 8000))}\n    memoryGiB: 0.5\n`;
    const noCommand = join(dir, 'no-command.yaml');
    writeFileSync(noCommand, engineConfig('    command: vsnap-no-such-engine\n'));
    await expectError({ args: ['serve', '--config', noCommand], code: 'E_CONFIG', exit: 1, message: /engine 'm': its command 'vsnap-no-such-engine' was not found.*`command:` for m/, hint: /--config/ });
    const exits = join(dir, 'exits.yaml');
    writeFileSync(exits, engineConfig(`    command: ${JSON.stringify(process.execPath)}\n    args: [-e, "process.exit(3)"]\n`));
    await expectError({ args: ['serve', '--config', exits], code: 'E_ENGINE_STATE', exit: 1, message: /engine 'm' exited \(code 3\)/, hint: /output is above.*`command:`, `args:` and `env:` in the --config file/, logs: true });
    await expectError({ args: ['swap', 'm', '--agent', DEAD], code: 'E_ENGINE_UNREACHABLE', exit: 1, hint: /--agent/ });
    await expectError({ args: ['swap', 'm', '--agent', 'nope'], code: 'E_USAGE', exit: 2, message: /--agent must be an http\(s\) URL/, hint: /swap --help/ });
    await expectError({ args: ['swap'], code: 'E_USAGE', exit: 2, message: /model/, hint: /swap --help/ });
    if (!(await cudaStatus()).available) {
      const out = join(dir, 'results');
      mkdirSync(out);
      const bench = await runCli(['bench', '--out', out]);
      expect(bench.code).toBe(1);
      expect(bench.stderr.trim().split('\n')).toHaveLength(1);
      expect(bench.stderr).toMatch(/bench needs an NVIDIA GPU/);
      expect(readdirSync(out)).toEqual([]); // nothing written
      const json = await runCli(['bench', '--json']);
      expect(json.code).toBe(1);
      expect(JSON.parse(json.stdout)).toMatchObject({ ok: false, code: 'E_CUDA_UNAVAILABLE', hint: expect.stringMatching(/vsnap doctor/) as string });
    }
  });
});
