import { chmodSync, openSync, readdirSync, writeSync, closeSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { runCli, type CliResult } from '../helpers/cli.js';
import { tempDir } from '../helpers/tmp.js';

/** The command, with no store from the environment. */
const vsnap = (...args: string[]): Promise<CliResult> => runCli(args, { VSNAP_STORE: '' });

describe('the vsnap command', () => {
  it('runs the CPU demo through a real store, then lists, verifies, detects damage and removes', async () => {
    const store = join(tempDir(), 'store');
    const demo = await vsnap('demo', '--cpu', '--size', '24', '--store', store);
    expect(demo.code).toBe(0);
    expect(demo.stdout).toMatch(/captured .* to /);
    expect(demo.stdout).toMatch(/checked +every byte: identical/);

    const ls = await vsnap('ls', '--store', store, '--json');
    expect(ls.code).toBe(0);
    const list = JSON.parse(ls.stdout) as Array<{ name: string; regions: number }>;
    expect(list).toEqual([expect.objectContaining({ name: 'demo', regions: 5 })]);

    expect((await vsnap('verify', 'demo', '--store', store)).stdout).toMatch(/demo \(.*\): ok/);
    const blobs = join(store, 'blobs');
    const prefix = readdirSync(blobs)[0]!;
    const blob = join(blobs, prefix, readdirSync(join(blobs, prefix))[0]!);
    chmodSync(blob, 0o644);
    const fd = openSync(blob, 'r+');
    writeSync(fd, Buffer.from('damage'), 0, 6, 100);
    closeSync(fd);
    const damaged = await vsnap('verify', 'demo', '--store', store);
    expect(damaged.code).toBe(3);
    expect(damaged.stdout).toMatch(/DAMAGED, 1 problem/);
    expect(damaged.stdout).toMatch(/E_CHECKSUM/);

    const rm = await vsnap('rm', 'demo', '--store', store, '--json');
    expect(rm.code).toBe(0);
    expect(JSON.parse(rm.stdout)).toMatchObject({ blobsRemoved: 5 });
  });

  it('prints the error code and the fix, with documented exit codes', async () => {
    const missing = await vsnap('verify', 'nope', '--store', join(tempDir(), 'absent'));
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/\[E_STORE_INVALID\]/);
    expect((await vsnap('frobnicate')).code).toBe(2);
    expect((await vsnap('verify', '--store', tempDir())).stderr).toMatch(/needs a snapshot name/);
    expect((await vsnap('--bogus')).code).toBe(2);
    expect((await vsnap('--help')).stdout).toMatch(/Exit codes/);
  });

  it('doctor reports the machine and the store', async () => {
    const out = await vsnap('doctor', '--store', join(tempDir(), 's'), '--json');
    expect(out.code).toBe(0);
    const report = JSON.parse(out.stdout) as { checksum: { algorithm: string }; cuda: { available: boolean }; store: { ok: boolean } };
    expect(report.checksum.algorithm).toBe('xxh3-128');
    expect(report.store.ok).toBe(true);
    expect(typeof report.cuda.available).toBe('boolean');
  });
});
