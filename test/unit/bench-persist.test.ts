// `npm run bench -- persist` (bench/persist.ts) on a few MiB: every pass runs, the fused digests
// equal the separate pass's, and the report and JSON say what was measured. No timing asserted.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { packageRoot } from '../../src/native/index.js';
import { tempDir } from '../helpers/tmp.js';

describe('bench persist', () => {
  it('measures the fused, two-pass and hash-only passes and leaves no blob behind', () => {
    const dir = tempDir();
    const json = join(tempDir(), 'persist.json');
    const root = packageRoot();
    const out = execFileSync(join(root, 'node_modules/.bin/tsx'), [join(root, 'bench/persist.ts'), '8', '2', '2'], {
      env: { ...process.env, VSNAP_BENCH_DIR: dir, VSNAP_BENCH_JSON: json },
      encoding: 'utf8',
    });
    expect(out).toMatch(/\| fused \| [0-9.]+ \|/);
    expect(out).toMatch(/\| two-pass \| [0-9.]+ \|/);
    expect(out).toMatch(/fused digests equal the separate pass's: true/);
    const report = JSON.parse(readFileSync(json, 'utf8')) as { agree: boolean; bytes: number; passes: Record<string, number[]> };
    expect(report.agree).toBe(true);
    expect(report.bytes).toBe(8 * 1024 * 1024);
    for (const name of ['fused', 'two-pass', 'hash only']) expect(report.passes[name]).toHaveLength(2);
    expect(readdirSync(dir)).toEqual([]);
  });
});
