import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

// @ts-expect-error: a plain JavaScript module of the repository's scripts
import { check, findReads } from '../../scripts/check-settings.mjs';
import { tempDir } from '../helpers/tmp.js';

// scripts/check-settings.mjs (a step of npm test): a VSNAP_* variable is read in src/settings.ts
// only. Run here on fixture text, so that it is proved to catch each form whatever src/ holds.

type Read = { line: number; variable: string; form: string };
const reads = (text: string): Read[] => findReads(text) as Read[];

describe('the settings check finds every form of a VSNAP_* read', () => {
  it.each([
    ['a property', 'const root = process.env.VSNAP_STORE;', 'VSNAP_STORE', 'property'],
    ['an optional property', 'const root = process.env?.VSNAP_STORE ?? "";', 'VSNAP_STORE', 'property'],
    ['a property of another name for the environment', 'const e = process.env;\nif (e.VSNAP_TOKEN) send();', 'VSNAP_TOKEN', 'property'],
    ['a property on the next line', 'const v = process.env\n  .VSNAP_DIGEST;', 'VSNAP_DIGEST', 'property'],
    ['an index in single quotes', "const v = process.env['VSNAP_REGION_MAPPING'];", 'VSNAP_REGION_MAPPING', 'index'],
    ['an index in double quotes', 'const v = process.env[ "VSNAP_PERSIST" ];', 'VSNAP_PERSIST', 'index'],
    ['an index in a plain template', 'const v = process.env[`VSNAP_ENGINE`];', 'VSNAP_ENGINE', 'index'],
    ['destructuring', 'const { VSNAP_TOKEN } = process.env;', 'VSNAP_TOKEN', 'destructuring'],
    ['destructuring with a rename and a default', "const { HOME, VSNAP_STAGING_IDLE_MS: idle = '30000' } = process.env;", 'VSNAP_STAGING_IDLE_MS', 'destructuring'],
    ['destructuring over lines, with a type', 'const {\n  PATH,\n  VSNAP_AGENT_URL,\n}: NodeJS.ProcessEnv = env;', 'VSNAP_AGENT_URL', 'destructuring'],
    ['destructuring assignment', 'let url;\n({ VSNAP_ENGINE_URL: url } = process.env);', 'VSNAP_ENGINE_URL', 'destructuring'],
    ['a presence test', "if ('VSNAP_FAILPOINTS' in process.env) die();", 'VSNAP_FAILPOINTS', 'in'],
  ])('%s', (_what, text, variable, form) => {
    expect(reads(text)).toEqual([expect.objectContaining({ variable, form })]);
  });

  it('a computed read of process.env, whose variable cannot be told', () => {
    expect(reads('const v = process.env[name];')).toEqual([{ line: 1, variable: '(computed)', form: 'computed' }]);
    expect(reads('const v = process.env[`VSNAP_${kind}`];')).toEqual([{ line: 1, variable: '(computed)', form: 'computed' }]);
  });

  it('says the line of each read', () => {
    expect(reads("import x from 'y';\n\nconst a = process.env.VSNAP_A;\nconst b = process.env['VSNAP_B'];\n")).toEqual([
      { line: 3, variable: 'VSNAP_A', form: 'property' },
      { line: 4, variable: 'VSNAP_B', form: 'index' },
    ]);
  });

  it('passes what is not a read: a child process environment written, names in messages, comment lines, other variables', () => {
    const text = [
      "const env = { ...process.env, VSNAP_BENCH_DROP_CACHES: drop ? '1' : '0' };",
      'spawn(cmd, { env: { ...m.env, ...(m.token ? { VSNAP_TOKEN: m.token } : {}) } });',
      "throw new UsageError('needs --engine <url> (or $VSNAP_ENGINE_URL)');",
      "process.emitWarning(message, { code: 'VSNAP_ENGINE' });",
      '// process.env.VSNAP_STORE is read in settings.ts',
      ' * `process.env.VSNAP_STORE` in a doc comment',
      "const home = process.env.XDG_DATA_HOME || process.env['HOME'];",
      'const { PATH } = process.env;',
    ].join('\n');
    expect(reads(text)).toEqual([]);
  });
});

describe('the settings check over a tree', () => {
  it('allows reads in settings.ts only, and names the file and line of every other', () => {
    const root = tempDir();
    mkdirSync(join(root, 'transfer'));
    writeFileSync(join(root, 'settings.ts'), 'export const idle = () => process.env.VSNAP_STAGING_IDLE_MS;\n');
    writeFileSync(join(root, 'transfer', 'staging.ts'), "import { idle } from '../settings.js';\n\nconst ms = Number(process.env.VSNAP_STAGING_IDLE_MS ?? 30_000);\n");
    writeFileSync(join(root, 'transfer', 'clean.ts'), "import { idle } from '../settings.js';\nexport const ms = idle();\n");
    const { problems, files } = check(root) as { problems: string[]; files: number };
    expect(files).toBe(3);
    expect(problems).toEqual([expect.stringMatching(/^src\/transfer\/staging\.ts:3: reads \$VSNAP_STAGING_IDLE_MS \(property\): read it through src\/settings\.ts/)]);
  });
});
