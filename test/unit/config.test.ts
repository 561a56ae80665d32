import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { loadConfig, parseConfig } from '../../src/swap/config.js';
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
    expect(c.listen).toEqual({ host: '127.0.0.1', port: 8080 });
    expect(c.queue).toEqual({ limit: 64, timeoutSeconds: 120 });
    expect(c.models.llama).toMatchObject({ gpus: [0], asleepGiB: 0, pinned: false, healthPath: '/health' });
    expect(c.models.qwen!.pinned).toBe(true);
  });

  it('reads JSON too, from a file', () => {
    const dir = tempDir();
    const path = join(dir, 'vsnap.json');
    writeFileSync(path, JSON.stringify({ store: '/s', gpus: { 0: { budgetGiB: 80 } }, models: { m: { url: 'http://127.0.0.1:9', memoryGiB: 1 } } }, null, 2));
    expect(loadConfig(path).models.m!.memoryGiB).toBe(1);
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

  it('the message names the file and line', () => {
    expect(() => parseConfig('store: /s\ngpus: {}\nmodels: {}\n', 'my.yaml')).toThrow(/my\.yaml:3:\d+ models: at least one model/);
  });
});
