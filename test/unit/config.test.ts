import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { createServer, type Server } from 'node:net';

import { validateName } from '../../src/store/names.js';
import { checkPorts, loadConfig, parseConfig, snapshotNameForModel } from '../../src/serve/config.js';
import { controllerOptionsOf } from '../../src/serve/controller-options.js';
import type { RegionStore } from '../../src/store/region-store.js';
import { tempDir } from '../helpers/tmp.js';

const good = `
store: /var/lib/vsnap
controlToken: \${env:CTL}
gpus:
  "0": { budgetGiB: 130 }
defaultModel: llama
models:
  llama:
    command: vllm
    args: [serve, meta/llama, --port, "\${PORT}", --enable-sleep-mode]
    port: 8001
    memoryGiB: 40
    ttlSeconds: 300
  qwen:
    url: http://10.0.0.2:8000
    memoryGiB: 20
    pinned: true
    deepSuspend: true
`;

function issues(text: string, env: NodeJS.ProcessEnv = { CTL: 'x' }) {
  try {
    parseConfig(text, 'vsnap.yaml', env);
  } catch (err) {
    expect(err).toBeInstanceOf(VsnapError);
    expect((err as VsnapError).code).toBe('E_CONFIG');
    return (err as VsnapError).details.issues as Array<{ path: string; line: number; message: string }>;
  }
  throw new Error('expected E_CONFIG');
}

describe('serve configuration', () => {
  it('reads YAML with defaults and ${env:...}', () => {
    const c = parseConfig(good, 'vsnap.yaml', { CTL: 'secret' });
    expect(c.controlToken).toBe('secret');
    expect(c.listen).toEqual({ host: '127.0.0.1', port: 8080, bodyStallSeconds: 10, responseStallSeconds: 30 });
    expect(c.queue).toEqual({ limit: 64, timeoutSeconds: 120 });
    expect(c.recovery).toEqual({ mode: 'reload', materialize: 'async' });
    expect(c.models.llama).toMatchObject({ gpus: [0], asleepGiB: 0, pinned: false, deepSuspend: false, healthPath: '/health' });
    expect(c.models.qwen).toMatchObject({ pinned: true, deepSuspend: true });
  });

  it('tokens a client could never send are refused at load, with the reason: whitespace, NUL, non-ASCII', () => {
    for (const [token, why] of [
      ['abc def', 'whitespace'],
      ['abc\tdef', 'whitespace'],
      ['tökén', 'printable ASCII'],
      ['abc\u0000def', 'printable ASCII'],
    ] as const) {
      const env = { CTL: token };
      const found = issues(good, env);
      expect(found.map((i) => i.path), token).toEqual(['controlToken']);
      expect(found[0]!.message, token).toContain(why);
      const key = issues(`${good}apiKey: \${env:CTL}\n`.replace('controlToken: ${env:CTL}\n', ''), env);
      expect(key.map((i) => i.path), token).toEqual(['apiKey']);
      const engine = issues(good.replace('    ttlSeconds: 300', '    ttlSeconds: 300\n    token: ${env:CTL}').replace('controlToken: ${env:CTL}\n', ''), env);
      expect(engine.map((i) => i.path), token).toEqual(['models.llama.token']);
    }
    expect(parseConfig(good, 'vsnap.yaml', { CTL: 'A-z_0.9~!#' }).controlToken).toBe('A-z_0.9~!#');
  });

  it('allowedHosts takes names: an entry with a port is refused at load, saying why', () => {
    const withHosts = (hosts: string) => good.replace('store: /var/lib/vsnap', `store: /var/lib/vsnap\nlisten: { allowedHosts: ${hosts} }`);
    const found = issues(withHosts('["example.com:8080", "[::1]:80", "ok.example", ".example.org", "*"]'));
    expect(found.map((i) => i.path)).toEqual(['listen.allowedHosts.0', 'listen.allowedHosts.1']);
    expect(found[0]!.message).toContain('without a port');
    expect(parseConfig(withHosts('["example.com", ".example.org", "*"]'), 'vsnap.yaml', { CTL: 'x' }).listen.allowedHosts).toEqual(['example.com', '.example.org', '*']);
  });

  it('the expected-response check per model: absent by default (the SDK default), mode and maxTokens checked', () => {
    expect(parseConfig(good, 'vsnap.yaml', { CTL: 'x' }).models.llama!.check).toBeUndefined();
    const withCheck = good.replace('    ttlSeconds: 300', '    ttlSeconds: 300\n    check: { mode: decode, maxTokens: 4 }');
    expect(parseConfig(withCheck, 'vsnap.yaml', { CTL: 'x' }).models.llama!.check).toEqual({ mode: 'decode', maxTokens: 4 });
    const bad = issues(good.replace('    ttlSeconds: 300', '    ttlSeconds: 300\n    check: { mode: greedy, maxTokens: 0, tokens: 2 }'));
    expect(bad.map((i) => i.path).sort()).toEqual(['models.llama.check', 'models.llama.check.maxTokens', 'models.llama.check.mode']);
  });

  it('reads JSON too, from a file', () => {
    const dir = tempDir();
    const path = join(dir, 'vsnap.json');
    writeFileSync(path, JSON.stringify({ store: '/s', gpus: { 0: { budgetGiB: 80 } }, models: { m: { url: 'http://127.0.0.1:9', memoryGiB: 1 } } }, null, 2));
    expect(loadConfig(path).models.m!.memoryGiB).toBe(1);
  });

  it('recovery: a mode and a materialize policy, nothing else', () => {
    expect(parseConfig(`${good}\nrecovery: { mode: fail, materialize: required }\n`, 'vsnap.yaml', { CTL: 'x' }).recovery).toEqual({ mode: 'fail', materialize: 'required' });
    expect(issues(`${good}\nrecovery: { mode: retry }\n`).map((i) => i.path)).toContain('recovery.mode');
  });

  it('codec: off by default; vsnap-c1 codes the RAM tier and the captures serve makes, into the controller and agent options; anything else is refused', () => {
    expect(parseConfig(good, 'vsnap.yaml', { CTL: 'x' }).codec).toBe('off');
    const coded = parseConfig(`${good}\ncodec: vsnap-c1\n`, 'vsnap.yaml', { CTL: 'x' });
    expect(coded.codec).toBe('vsnap-c1');
    const parts = { store: {} as RegionStore, clients: new Map(), sources: new Map(), ram: undefined, booting: [] };
    expect(controllerOptionsOf(coded, parts).codec).toBe('vsnap-c1');
    expect(controllerOptionsOf(parseConfig(good, 'vsnap.yaml', { CTL: 'x' }), parts)).not.toHaveProperty('codec');
    for (const bad of ['zstd', 'true', 'on', '{ ram: vsnap-c1 }']) {
      expect(issues(`${good}\ncodec: ${bad}\n`)).toEqual([expect.objectContaining({ path: 'codec', message: expect.stringMatching(/vsnap-c1.*off|off.*vsnap-c1|Expected string/) as string })]);
    }
    expect(issues(`${good}\ncodecs: vsnap-c1\n`).map((i) => i.message).join()).toMatch(/codecs/);
  });

  it('registry: a reference per model, checked for its shape', () => {
    const withRef = good.replace('    ttlSeconds: 300', '    ttlSeconds: 300\n    registry: registry.example.com/team/llama:v1');
    expect(parseConfig(withRef, 'vsnap.yaml', { CTL: 'x' }).models.llama!.registry).toBe('registry.example.com/team/llama:v1');
    expect(issues(good.replace('    ttlSeconds: 300', '    ttlSeconds: 300\n    registry: llama v1')).map((i) => i.path)).toContain('models.llama.registry');
  });

  it('registry: a reference the pulls could not parse is refused at load, with the parser\'s reason', () => {
    const withRef = (ref: string) => good.replace('    ttlSeconds: 300', `    ttlSeconds: 300\n    registry: "${ref}"`);
    for (const bad of ['team/llama:v1', 'registry.example.com/Team/llama:v1', 'registry.example.com/team/llama:v1:v2', 'registry.example.com/team/llama@sha256:abc']) {
      const found = issues(withRef(bad));
      expect(found, bad).toEqual([expect.objectContaining({ path: 'models.llama.registry', line: 14, message: expect.stringContaining('is not a registry reference') })]);
    }
    expect(parseConfig(withRef('http://localhost:5000/team/llama@sha256:' + 'a'.repeat(64)), 'vsnap.yaml', { CTL: 'x' }).models.llama!.registry).toMatch(/^http:\/\/localhost/);
  });

  it('a model named __proto__ (or any __proto__ key) is refused with its line, not dropped', () => {
    const proto = good.replace('  qwen:', '  __proto__:');
    expect(issues(proto)).toEqual([expect.objectContaining({ path: 'models.__proto__', line: 14, message: expect.stringContaining('"__proto__" cannot be a key') })]);
    expect(issues(good.replace('    ttlSeconds: 300', '    ttlSeconds: 300\n    env: { __proto__: x }')).map((i) => i.path)).toEqual(['models.llama.env.__proto__']);
  });

  it('GPU keys: one spelling per device ("00" and 0 beside "0" are refused, not a silent second budget)', () => {
    const gpus = (g: string) => good.replace('  "0": { budgetGiB: 130 }', g);
    expect(issues(gpus('  "0": { budgetGiB: 130 }\n  "00": { budgetGiB: 1 }'))).toEqual([expect.objectContaining({ path: 'gpus.00', line: 6, message: expect.stringMatching(/without leading zeros/) })]);
    expect(issues(gpus('  "0": { budgetGiB: 130 }\n  0: { budgetGiB: 1 }'))).toEqual([expect.objectContaining({ path: 'gpus.0', line: 6, message: expect.stringMatching(/appears twice/) })]);
    expect(issues(gpus('  "01": { budgetGiB: 130 }')).map((i) => i.path)).toContain('gpus.01');
    expect(parseConfig(gpus('  "0": { budgetGiB: 130 }\n  "10": { budgetGiB: 1 }'), 'vsnap.yaml', { CTL: 'x' }).gpus).toEqual({ 0: { budgetGiB: 130 }, 10: { budgetGiB: 1 } });
  });

  it('a YAML alias bomb is an E_CONFIG naming the file and the line of the first alias, not E_INTERNAL', () => {
    const bomb = ['a: &a [x, x, x, x, x, x, x, x, x]', 'b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]', 'c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]', 'd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]', ''].join('\n');
    const found = issues(bomb + good);
    expect(found).toEqual([expect.objectContaining({ path: '(syntax)', line: 2, message: expect.stringMatching(/alias/) })]);
    expect(() => parseConfig(bomb + good, 'bomb.yaml', { CTL: 'x' })).toThrow(/bomb\.yaml:2:\d+ \(syntax\)/);
  });

  it('reports every problem with its path and line', () => {
    // lines count from the template's leading newline: `store` is line 2
    const bad = good.replace('memoryGiB: 40', 'memoryGiB: -1').replace('    pinned: true', '    pinned: yes please\n    colour: blue');
    const found = issues(bad);
    const by = Object.fromEntries(found.map((i) => [i.path, i]));
    expect(by['models.llama.memoryGiB']).toMatchObject({ line: 12 });
    expect(by['models.qwen.pinned']).toMatchObject({ line: 17 });
    expect(found.some((i) => /colour/.test(i.message))).toBe(true);
    const unknownDefault = issues(good.replace('defaultModel: llama', 'defaultModel: mistral'));
    expect(unknownDefault).toEqual([expect.objectContaining({ path: 'defaultModel', line: 6, message: "'mistral' is not one of the models" })]);
  });

  it('syntax errors, missing environment, and model rules', () => {
    expect(issues('store: [unclosed\n')[0]).toMatchObject({ path: '(syntax)', line: expect.any(Number) });
    expect(issues(good, {})).toContainEqual(expect.objectContaining({ path: 'controlToken', message: 'environment variable CTL is not set' }));
    const noWay = issues('store: /s\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n  m: { memoryGiB: 1, gpus: [1] }\n');
    expect(noWay.map((i) => i.message).join('\n')).toMatch(/either url .* or command/);
    expect(noWay.map((i) => i.message).join('\n')).toMatch(/gpu 1 has no budget/);
  });

  it('a missing key says it is required, with the line of the mapping that lacks it (not zod\'s "expected string, received undefined")', () => {
    const noMemory = good.replace('    memoryGiB: 20\n', '');
    expect(issues(noMemory)).toEqual([expect.objectContaining({ path: 'models.qwen.memoryGiB', line: 15, message: 'is required (a number)' })]);
    expect(() => parseConfig(noMemory, 'my.yaml', { CTL: 'x' })).toThrow(/my\.yaml:15:5 models\.qwen\.memoryGiB is required \(a number\)$/m);
    expect(() => parseConfig(good.replace('store: /var/lib/vsnap\n', ''), 'my.yaml', { CTL: 'x' })).toThrow(/my\.yaml:2:1 store is required \(a string\)$/m);
    // a value that is there but of the wrong type keeps the type message
    expect(issues(good.replace('memoryGiB: 20', 'memoryGiB: lots'))).toEqual([expect.objectContaining({ path: 'models.qwen.memoryGiB', message: expect.stringMatching(/expected number, received string/) })]);
  });

  it('an unquoted ${env:X} or ${PORT} inside a flow mapping or list is one problem, at its place, saying to quote it', () => {
    const flowMap = good.replace('  qwen:\n    url: http://10.0.0.2:8000\n', '  qwen:\n    url: http://10.0.0.2:8000\n    env: { HF_TOKEN: ${env:CTL}, A: b }\n');
    const found = issues(flowMap);
    expect(found).toEqual([expect.objectContaining({ path: '(syntax)', line: 16, message: expect.stringContaining('quote it: "${env:CTL}"') })]);
    expect(() => parseConfig(flowMap, 'my.yaml', { CTL: 'x' })).toThrow(/\(1 problem\):\n {2}my\.yaml:16:22 \(syntax\): \$\{env:CTL\} is not quoted inside a flow mapping or list/);
    const flowList = issues(good.replace('"${PORT}"', '${PORT}'));
    expect(flowList).toEqual([expect.objectContaining({ path: '(syntax)', line: 10, message: expect.stringContaining('quote it: "${PORT}"') })]);
    // quoted, or in block style, it is fine
    expect(() => parseConfig(flowMap.replace('${env:CTL}, A', '"${env:CTL}", A'), 'my.yaml', { CTL: 'x' })).not.toThrow();
    expect(() => parseConfig(good.replace('controlToken: ${env:CTL}', 'controlToken: ${env:CTL}'), 'my.yaml', { CTL: 'x' })).not.toThrow();
  });

  it('the message names the file and line', () => {
    expect(() => parseConfig('store: /s\ngpus: {}\nmodels: {}\n', 'my.yaml')).toThrow(/my\.yaml:3:\d+ models: at least one model/);
  });

  it('a model name with / and : gets a valid default snapshot name, distinct per model', () => {
    const c = parseConfig(
      'store: /s\ngpus: { "0": { budgetGiB: 80 } }\nmodels:\n  meta-llama/Llama-3.1-8B: { url: "http://h:1", memoryGiB: 20 }\n  qwen:7b: { url: "http://h:2", memoryGiB: 20 }\n  own: { url: "http://h:3", memoryGiB: 1, snapshot: mine }\n',
      'v.yaml',
    );
    expect(c.models['meta-llama/Llama-3.1-8B']!.snapshot).toBe('meta-llama--Llama-3.1-8B');
    expect(c.models['qwen:7b']!.snapshot).toBe('qwen-7b');
    expect(c.models.own!.snapshot).toBe('mine');
    for (const m of Object.values(c.models)) expect(validateName(m.snapshot)).toBe(m.snapshot);
    // every model name the schema accepts maps to a valid snapshot name, long ones included
    for (const name of ['a/'.repeat(63) + 'b', `${'x'.repeat(127)}:`, 'org/m:v1/q', '0/0']) {
      expect(validateName(snapshotNameForModel(name))).toBeTruthy();
    }
    expect(snapshotNameForModel('a/'.repeat(63) + 'b')).not.toBe(snapshotNameForModel('a/'.repeat(63) + 'c'));
  });

  it('refuses an invalid snapshot name, and two models sharing one', () => {
    const two = issues('store: /s\ngpus: { "0": { budgetGiB: 80 } }\nmodels:\n  a/b: { url: "http://h:1", memoryGiB: 1 }\n  a--b: { url: "http://h:2", memoryGiB: 1 }\n');
    expect(two).toEqual([expect.objectContaining({ path: 'models.a--b.snapshot', message: expect.stringMatching(/also model 'a\/b'/) })]);
    const bad = issues('store: /s\ngpus: { "0": { budgetGiB: 80 } }\nmodels:\n  m: { url: "http://h:1", memoryGiB: 1, snapshot: ../x }\n');
    expect(bad).toEqual([expect.objectContaining({ path: 'models.m.snapshot', line: 4 })]);
  });

  it('budgets are checked at load: an engine larger than its GPU, pinned engines that cannot all fit, asleep above awake', () => {
    const found = issues(
      'store: /s\ngpus: { "0": { budgetGiB: 80 }, "1": { budgetGiB: 40 } }\nmodels:\n' +
        '  big: { url: "http://h:1", memoryGiB: 60, gpus: [0, 1] }\n' +
        '  p1: { url: "http://h:2", memoryGiB: 50, pinned: true }\n' +
        '  p2: { url: "http://h:3", memoryGiB: 40, pinned: true, asleepGiB: 41 }\n',
    );
    expect(found.map((i) => `${i.path}: ${i.message}`).sort()).toEqual([
      "gpus.0.budgetGiB: the pinned models need 90 GiB of gpu 0, more than its 80 GiB: they can never all be awake",
      "models.big.memoryGiB: 60 GiB does not fit gpu 1's budget of 40 GiB",
      'models.p2.asleepGiB: 41 GiB asleep is more than the 40 GiB awake',
    ]);
    expect(found.find((i) => i.path === 'models.big.memoryGiB')!.line).toBe(4);
  });

  it('two started engines on one port, or on the listen port, are refused', () => {
    const found = issues(
      'store: /s\nlisten: { port: 9000 }\ngpus: { "0": { budgetGiB: 80 } }\nmodels:\n  a: { command: x, port: 9000, memoryGiB: 1 }\n  b: { command: x, port: 9001, memoryGiB: 1 }\n  c: { command: x, port: 9001, memoryGiB: 1 }\n',
    );
    expect(found.map((i) => `${i.path}: ${i.message}`)).toEqual(['models.a.port: port 9000 is also listen.port', 'models.c.port: port 9001 is also models.b.port']);
  });

  it('checkPorts finds a listen or engine port in use before anything starts', async () => {
    const busy: Server = createServer();
    await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
    const port = (busy.address() as { port: number }).port;
    try {
      const config = (listen: number, engine: number) =>
        parseConfig(`store: /s\nlisten: { port: ${listen} }\ngpus: { "0": { budgetGiB: 80 } }\nmodels:\n  m: { command: x, port: ${engine}, memoryGiB: 1 }\n`, 'v.yaml');
      const free = await new Promise<number>((resolve) => {
        const s = createServer().listen(0, '127.0.0.1', () => {
          const p = (s.address() as { port: number }).port;
          s.close(() => resolve(p));
        });
      });
      const err = await checkPorts(config(port, free)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(VsnapError);
      expect(err).toMatchObject({ code: 'E_ADDRESS_IN_USE', details: { ports: [expect.objectContaining({ what: 'listen', port })] } });
      expect((err as VsnapError).details.ports).toHaveLength(1);
      await expect(checkPorts(config(0, port))).rejects.toMatchObject({ code: 'E_ADDRESS_IN_USE', details: { ports: [expect.objectContaining({ what: 'models.m.port' })] } });
      await expect(checkPorts(config(0, free))).resolves.toBeUndefined();
    } finally {
      busy.close();
    }
  });
});
