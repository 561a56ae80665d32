import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { tempDir } from '../helpers/tmp.js';

// bench/peers.py runs on the GPU machine only (torch, safetensors); its dry run here keeps the
// script runnable and its region sizes the same as bench/transfer.ts's.
describe('bench/peers.py (dry run: no torch, no GPU)', () => {
  it('lays out the same regions as the transfer benchmark and writes its JSON and table', () => {
    const out = join(tempDir(), 'peers.json');
    execFileSync('python3', ['bench/peers.py', '--gib', '16', '--out', out, '--dry-run'], { stdio: 'ignore' });
    const result = JSON.parse(readFileSync(out, 'utf8')) as Record<string, unknown>;
    // 1 GiB x2, 2 MiB x2, then 448 MiB layers: 31 of them and a 444 MiB remainder.
    expect(result).toMatchObject({ gib: 16, bytes: 16 * 2 ** 30, regions: 36 });
    for (const section of ['safetensors', 'torchCopy', 'checkpoint', 'engineReload']) expect(result[section]).toEqual({ skipped: 'dry run' });
    expect(readFileSync(out.replace(/\.json$/, '.md'), 'utf8')).toMatch(/^\| peer \(same 16 GiB\) \| seconds \| GB\/s \|/);
  });

  it('refuses a size that cannot hold the fixed regions', () => {
    expect(() => execFileSync('python3', ['bench/peers.py', '--gib', '1', '--out', join(tempDir(), 'x.json'), '--dry-run'], { stdio: 'pipe' })).toThrow(/2 GiB/);
  });
});
