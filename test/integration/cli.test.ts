import { spawn } from 'node:child_process';
import { chmodSync, closeSync, existsSync, openSync, readdirSync, writeSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { cliPath, runCli, type CliResult } from '../helpers/cli.js';
import { tempDir } from '../helpers/tmp.js';
import { weights } from '../helpers/codec-data.js';

/** A store whose snapshot "demo" is another model's. */
async function seedForeignDemo(root: string): Promise<void> {
  const host = HostRegion.create(4096);
  try {
    await Snapshot.capture(await RegionStore.open(root), 'demo', { regions: [{ key: 'w', size: 4096, memory: host.memory }], model: { id: 'someone/else' } });
  } finally {
    host.close();
  }
}

/** The command, with no store from the environment. */
const vsnap = (...args: string[]): Promise<CliResult> => runCli(args, { VSNAP_STORE: '' });

describe('the vsnap command', () => {
  it('lists a snapshot stored coded with the bytes its blobs take and the ratio', async () => {
    const root = join(tempDir(), 'store');
    const bytes = weights('bf16', 'gaussian', 4 * 1024 * 1024, 3);
    const host = HostRegion.create(bytes.length);
    try {
      host.write(0, bytes);
      const tensors = [{ name: 'w', offset: 0, dtype: 'torch.bfloat16', shape: [bytes.length / 2] }];
      await Snapshot.capture(await RegionStore.open(root), 'coded', { regions: [{ key: 'w', size: bytes.length, memory: host.memory, tensors }], chunkSize: 1024 * 1024, codec: 'vsnap-c1' });
    } finally {
      host.close();
    }
    const human = (await vsnap('ls', '--store', root)).stdout.split('\n');
    expect(human[1]).toMatch(/^coded +\S+ +\S+ +4\.00 MiB +2\.\d\d MiB \(0\.[67]\dx\) +1 +1$/);
    const [row] = JSON.parse((await vsnap('ls', '--store', root, '--json')).stdout) as Array<{ bytes: number; storedBytes: number }>;
    expect(row!.bytes).toBe(bytes.length);
    expect(row!.storedBytes / row!.bytes).toBeLessThan(0.75);
  });

  it('runs the CPU demo through a real store, then lists (with a header, and --all), verifies, detects damage and removes', async () => {
    const store = join(tempDir(), 'store');
    const demo = await vsnap('demo', '--cpu', '--size', '24', '--store', store);
    expect(demo.code).toBe(0);
    expect(demo.stdout).toMatch(/captured .* to /);
    expect(demo.stdout).toMatch(/^filling +5 regions/m); // each slow pass says what it does before it starts
    expect(demo.stdout).toMatch(/^checking +every byte/m);
    expect(demo.stdout).toMatch(/checked +every byte: identical/);
    const again = await vsnap('demo', '--cpu', '--size', '24', '--store', store, '--json');
    expect(again.code).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({ ok: true, device: 'cpu', store, regions: 5, capture: { bytes: expect.any(Number) as number } });

    const ls = await vsnap('ls', '--store', store, '--json');
    expect(ls.code).toBe(0);
    const list = JSON.parse(ls.stdout) as Array<{ name: string; regions: number }>;
    expect(list).toEqual([expect.objectContaining({ name: 'demo', regions: 5, versions: 2 })]);
    const human = (await vsnap('ls', '--store', store)).stdout.split('\n');
    expect(human[0]).toMatch(/^NAME +CAPTURE +CREATED +SIZE +STORED +REGIONS +VERSIONS$/);
    expect(human[1]).toMatch(/^demo +\S+ +\S+ +24\.00 MiB +24\.00 MiB \(1\.00x\) +5 +2$/); // the size asked for, not 23.99 MiB
    const all = await vsnap('ls', '--all', '--store', store);
    expect(all.stdout.split('\n')[0]).toMatch(/^NAME +CAPTURE +CURRENT +CREATED +SIZE +STORED +REGIONS +DURABLE$/);
    expect(all.stdout.trim().split('\n')).toHaveLength(3);
    const allJson = JSON.parse((await vsnap('ls', '--all', '--store', store, '--json')).stdout) as Array<{ id: string; current: boolean; durable: boolean }>;
    expect(allJson.map((c) => c.current)).toEqual([false, true]);

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
    expect(damaged.stdout).toMatch(/remove it with: vsnap rm demo --id \S+/);
    expect(damaged.stdout).not.toMatch(/vsnap verify/);

    const rm = await vsnap('rm', 'demo', '--store', store, '--json');
    expect(rm.code).toBe(0);
    expect(JSON.parse(rm.stdout)).toMatchObject({ blobsRemoved: 5 });
  });

  it('per-command help, `help <cmd>`, usage errors exit 2', async () => {
    const help = await vsnap('--help');
    expect(help.stdout).toMatch(/Exit codes/);
    const suspend = await vsnap('suspend', '--help');
    expect(suspend.code).toBe(0);
    expect(suspend.stdout).toMatch(/--capture/);
    expect(suspend.stdout).not.toMatch(/--size|--config|--agent/);
    const swap = await vsnap('help', 'swap');
    expect(swap.stdout).toMatch(/\$VSNAP_CONTROL_TOKEN/);
    expect(swap.stdout).not.toMatch(/--capture/);
    expect((await vsnap('frobnicate')).code).toBe(2);
    expect((await vsnap('--bogus')).code).toBe(2);
    expect((await vsnap('ls', '--capture')).code).toBe(2);
    expect((await vsnap('verify', '--store', tempDir())).stderr).toMatch(/missing required argument 'name'/);
    expect((await vsnap('demo', '--size', '0')).code).toBe(2);
  });

  it('doctor reports the machine and the store, and creates nothing', async () => {
    const root = join(tempDir(), 'not', 'yet');
    const out = await vsnap('doctor', '--store', root, '--json');
    expect(out.code).toBe(0);
    const report = JSON.parse(out.stdout) as { checksum: { algorithm: string }; cuda: { available: boolean }; store: { ok: boolean; exists: boolean } };
    expect(report.checksum.algorithm).toBe('xxh3-128');
    expect(report.store).toMatchObject({ ok: true, exists: false });
    expect(typeof report.cuda.available).toBe('boolean');
    expect(existsSync(join(root, '..'))).toBe(false);
    // glibc and libstdc++ against the prebuild's needs (prebuilds/REQUIREMENTS.json), in both forms
    expect((report as unknown as { platform: { libc: { family: string }; libstdcxx: { glibcxx: string }; unmet: string[] } }).platform).toMatchObject({ libc: { family: 'glibc' }, libstdcxx: { glibcxx: expect.stringMatching(/^3\.4\./) as string }, unmet: [] });
    const human = await vsnap('doctor', '--store', root);
    expect(human.stdout).toMatch(/^platform: linux-\w+, glibc 2\.\d+, libstdc\+\+ GLIBCXX_3\.4\.\d+ \(.*\); the prebuild needs glibc 2\.\d+ and GLIBCXX_3\.4\.\d+: met$/m);
  });

  it('one default store: what ls and doctor say before the demo is where the demo writes, and ls then lists it', async () => {
    const home = tempDir();
    const env = { VSNAP_STORE: '', XDG_DATA_HOME: '', XDG_CACHE_HOME: '', HOME: home };
    const expected = join(home, '.local', 'share', 'vsnap');
    const before = await runCli(['ls'], env);
    expect(before.code).toBe(1);
    expect(before.stderr).toContain(`[E_STORE_INVALID] no store at ${expected}\n`);
    expect(before.stderr).toMatch(/hint: .*a store is made by the first `vsnap snapshot`, `vsnap pull` or `vsnap demo`/);
    const doctor = await runCli(['doctor'], env);
    expect(doctor.stdout).toContain(`store: ${expected}: none yet (made by the first \`vsnap snapshot\`, \`vsnap pull\` or \`vsnap demo\`)`);

    const demo = await runCli(['demo', '--cpu', '--size', '8'], env);
    expect(demo.code, demo.stderr).toBe(0);
    expect(demo.stdout).toContain(`store     ${expected}, snapshot "demo" (list it with: npx vsnap ls; remove it with: npx vsnap rm demo)`);
    expect(JSON.parse((await runCli(['demo', '--cpu', '--size', '8', '--json'], env)).stdout)).toMatchObject({ store: expected });
    const after = await runCli(['ls', '--json'], env);
    expect(after.code).toBe(0);
    expect(JSON.parse(after.stdout)).toEqual([expect.objectContaining({ name: 'demo', versions: 2 })]);
    expect((await runCli(['doctor'], env)).stdout).toContain(`store: ${expected}: 1 snapshot(s)`);
    expect(existsSync(join(home, '.cache'))).toBe(false); // no second store anywhere else
  });

  it('the demo never writes over a snapshot called "demo" of another model', async () => {
    const store = join(tempDir(), 'store');
    await seedForeignDemo(store);
    const out = await vsnap('demo', '--cpu', '--size', '8', '--store', store);
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/already has a snapshot "demo" of another model \(someone\/else\).*--store/);
    expect(JSON.parse((await vsnap('ls', '--all', '--store', store, '--json')).stdout)).toHaveLength(1);
  });

  it('Ctrl-C during a capture aborts it through its AbortSignal, says so, exits 130 and leaves no temporary files', async () => {
    const store = join(tempDir(), 'store');
    const child = spawn(process.execPath, [cliPath, 'demo', '--cpu', '--size', '256', '--store', store], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    // interrupt once the capture has begun writing into the store's tmp/
    for (;;) {
      const tmp = join(store, 'tmp');
      if (existsSync(tmp) && readdirSync(tmp).some((e) => !e.endsWith('.lock'))) break;
      if (child.exitCode !== null) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    child.kill('SIGINT');
    expect(await exited, stderr).toBe(130);
    expect(stderr).toMatch(/interrupted: stopping and removing temporary files/);
    expect(stderr).toMatch(/\[E_ABORTED\]/);
    expect(readdirSync(join(store, 'tmp'))).toEqual([]);
    if (!/captured /.test(stdout)) expect(JSON.parse((await vsnap('ls', '--store', store, '--json')).stdout)).toEqual([]);
  });

  it('a second Ctrl-C exits at once', async () => {
    const child = spawn(process.execPath, [cliPath, 'demo', '--cpu', '--size', '4096', '--store', join(tempDir(), 's')], { stdio: ['ignore', 'pipe', 'pipe'] });
    await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    child.kill('SIGINT');
    child.kill('SIGINT');
    expect(await exited).toBe(130);
  });
});
