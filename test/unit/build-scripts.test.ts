import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { tempDir } from '../helpers/tmp.js';

// scripts/build.mjs (dist/ rebuilt only when its recorded inputs differ) and scripts/test.mjs
// (npm test's pipeline: the reliability report runs after vitest even when vitest fails).
interface BuildScript {
  inputsDigest(root: string): string;
  staleReason(root: string): string | undefined;
}
interface Step {
  label: string;
  command: string;
  args: string[];
}
interface TestScript {
  pipeline(p: { before: Step[]; tests: Step; report: Step; partial?: boolean }): number;
}
const build = (await import(new URL('../../scripts/build.mjs', import.meta.url).href)) as BuildScript;
const runner = (await import(new URL('../../scripts/test.mjs', import.meta.url).href)) as TestScript;

function write(root: string, rel: string, text: string): void {
  mkdirSync(join(root, rel, '..'), { recursive: true });
  writeFileSync(join(root, rel), text);
}

/** A checkout with src/, the build's configuration and a complete dist/, recorded as built from them. */
function builtTree(): string {
  const root = tempDir();
  write(root, 'src/index.ts', 'export const a = 1;\n');
  write(root, 'src/deep/b.ts', 'export const b = 2;\n');
  for (const f of ['tsup.config.ts', 'tsconfig.json', 'package.json', 'package-lock.json']) write(root, f, `${f}\n`);
  for (const f of ['index.js', 'index.cjs', 'index.d.ts', 'index.d.cts', 'cli/main.js']) write(root, `dist/${f}`, '');
  write(root, 'dist/.build-inputs', `${build.inputsDigest(root)}\n`);
  return root;
}

describe('npm test builds dist/ only when it is stale (scripts/build.mjs)', () => {
  it('a dist/ recorded as built from the inputs as they are is up to date', () => {
    expect(build.staleReason(builtTree())).toBeUndefined();
  });

  it('any change to src/ or to the build configuration makes it stale, and so does an incomplete or unrecorded dist/', () => {
    const cases: Array<[string, (root: string) => void, RegExp]> = [
      ['a source edited', (r) => write(r, 'src/deep/b.ts', 'export const b = 3;\n'), /src\/ or the build configuration changed/],
      ['a source added', (r) => write(r, 'src/c.ts', ''), /changed/],
      ['the tsup config', (r) => write(r, 'tsup.config.ts', 'x'), /changed/],
      ['the lock file', (r) => write(r, 'package-lock.json', 'x'), /changed/],
      ['an empty record', (r) => write(r, 'dist/.build-inputs', ''), /changed/],
      ['no record', (r) => rmSync(join(r, 'dist/.build-inputs')), /no record of what it was built from/],
      ['an output missing', (r) => rmSync(join(r, 'dist/cli/main.js')), /dist\/ lacks cli\/main\.js/],
    ];
    for (const [what, change, why] of cases) {
      const root = builtTree();
      change(root);
      expect(build.staleReason(root), what).toMatch(why);
    }
    const unbuilt = tempDir();
    write(unbuilt, 'src/index.ts', '');
    expect(build.staleReason(unbuilt)).toMatch(/dist\/ lacks index\.js/);
  });
});

describe('npm test (scripts/test.mjs)', () => {
  const node = (code: string, label = code): Step => ({ label, command: process.execPath, args: ['-e', code] });
  const marking = (file: string, status = 0) => node(`require('fs').writeFileSync(${JSON.stringify(file)}, 'ran'); process.exit(${status})`, 'report');

  it('prints the reliability report when vitest fails, and still exits with vitest\'s status', () => {
    const marker = join(tempDir(), 'reported');
    expect(runner.pipeline({ before: [node('process.exit(0)')], tests: node('process.exit(3)', 'vitest'), report: marking(marker) })).toBe(3);
    expect(existsSync(marker)).toBe(true);
  });

  it('a failing step before vitest stops the run; a passing run exits with the report\'s status, or 0 for a partial run', () => {
    const dir = tempDir();
    const ran = join(dir, 'tests-ran');
    expect(runner.pipeline({ before: [node('process.exit(2)')], tests: marking(ran), report: marking(join(dir, 'r')) })).toBe(2);
    expect(existsSync(ran)).toBe(false);
    expect(runner.pipeline({ before: [], tests: node('process.exit(0)'), report: marking(join(dir, 'r1'), 1) })).toBe(1);
    expect(runner.pipeline({ before: [], tests: node('process.exit(0)'), report: marking(join(dir, 'r2'), 1), partial: true })).toBe(0);
  });
});
