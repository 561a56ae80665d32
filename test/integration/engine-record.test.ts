import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { afterEach, describe, expect, it } from 'vitest';

import { EngineRecord } from '../../src/serve/engine-record.js';
import { groupMembers, until } from '../helpers/serve-process.js';
import { tempDir } from '../helpers/tmp.js';

// The record of the engines a serve started: a restart stops only processes that are still
// the ones recorded (same pid, same start time, same boot), and never those of a serve that runs.

const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) {
    try {
      process.kill(-c.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  }
});

/** A process leading its own group, with a child of its own (as an engine and its engine core). */
async function engineLike(): Promise<{ pid: number; startTime: string }> {
  const c = spawn(process.execPath, ['-e', "require('child_process').spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' }); setInterval(() => {}, 1000)"], { detached: true, stdio: 'ignore' });
  children.push(c);
  await until(() => groupMembers(c.pid!).length === 2);
  const stat = readFileSync(`/proc/${c.pid}/stat`, 'utf8');
  return { pid: c.pid!, startTime: stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]! };
}

const bootId = (): string => readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
const deadOwner = { pid: 2 ** 22 + 1, startTime: '1' }; // above pid_max's default: no such process

function writeRecord(path: string, owner: { pid: number; startTime: string }, engines: Array<{ name: string; pid: number; startTime: string }>, boot = bootId()): void {
  writeFileSync(path, JSON.stringify({ version: 1, bootId: boot, owner, engines }));
}

describe('EngineRecord', () => {
  it('a dead serve\'s engine group is stopped (the leader and its children); a pid whose start time differs, or a record from another boot, is left alone', async () => {
    const dir = tempDir();
    const [left, stranger, otherBoot] = [await engineLike(), await engineLike(), await engineLike()];
    const record = EngineRecord.forServe(join(dir, 'store'), { host: '127.0.0.1', port: 8080 }, dir);
    writeRecord(record.path, deadOwner, [
      { name: 'left', ...left },
      { name: 'reused', pid: stranger.pid, startTime: String(Number(stranger.startTime) - 1) }, // that pid is another process now
    ]);
    const report = await record.stopLeftovers(5000);
    expect(report.stopped).toEqual([{ name: 'left', pid: left.pid, processes: 2, killed: false }]);
    expect(groupMembers(left.pid)).toEqual([]);
    expect(groupMembers(stranger.pid)).toHaveLength(2);
    const taken = JSON.parse(readFileSync(record.path, 'utf8')) as { owner: { pid: number }; engines: unknown[] };
    expect(taken).toMatchObject({ owner: { pid: process.pid }, engines: [] });
    record.remove();

    const again = EngineRecord.forServe(join(dir, 'store'), { host: '127.0.0.1', port: 8080 }, dir);
    writeRecord(again.path, deadOwner, [{ name: 'old', ...otherBoot }], 'another-boot');
    expect((await again.stopLeftovers(5000)).stopped).toEqual([]);
    expect(groupMembers(otherBoot.pid)).toHaveLength(2);
    again.remove();
  });

  it('the engines of a serve that still runs are left alone, and nothing is recorded over its record', async () => {
    const dir = tempDir();
    const owner = await engineLike(); // stands for the serve that wrote the record
    const engine = await engineLike();
    const record = EngineRecord.forServe(join(dir, 'store'), { host: '0.0.0.0', port: 9000 }, dir);
    writeRecord(record.path, owner, [{ name: 'e', ...engine }]);
    const before = readFileSync(record.path, 'utf8');
    expect(await record.stopLeftovers(5000)).toEqual({ stopped: [], ownerRunning: owner.pid });
    expect(groupMembers(engine.pid)).toHaveLength(2);
    record.started('x', process.pid);
    record.remove();
    expect(readFileSync(record.path, 'utf8')).toBe(before);
  });

  it('one record per store and listen address', () => {
    const a = EngineRecord.forServe('/s', { host: '127.0.0.1', port: 8080 }, '/state');
    expect(EngineRecord.forServe('/s', { host: '127.0.0.1', port: 8080 }, '/state').path).toBe(a.path);
    expect(EngineRecord.forServe('/s', { host: '127.0.0.1', port: 8081 }, '/state').path).not.toBe(a.path);
    expect(EngineRecord.forServe('/t', { host: '127.0.0.1', port: 8080 }, '/state').path).not.toBe(a.path);
    expect(a.path).toMatch(/^\/state\/engines-[0-9a-f]{16}\.json$/);
  });
});

describe('EngineRecord where it cannot be written', () => {
  it('a state directory that cannot be made is a problem said, not a failure', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'file'), 'x'); // a file where the directory would go
    const record = EngineRecord.forServe(join(dir, 'store'), { host: '127.0.0.1', port: 8080 }, join(dir, 'file', 'state'));
    expect(await record.stopLeftovers(1000)).toEqual({ stopped: [] });
    expect(record.problem).toMatch(/cannot write .*ENOTDIR/);
    record.started('e', process.pid); // nothing thrown, nothing written
    record.remove();
  });

  it('a state directory under /proc is a problem said at once, not a hang (Node 20\'s recursive mkdirSync loops there)', async () => {
    // in a child: the defect is a synchronous loop, which no test timeout in this process could stop
    const script = `
      const { EngineRecord } = await import(${JSON.stringify(new URL('../../src/serve/engine-record.ts', import.meta.url).href)});
      const record = EngineRecord.forServe('/tmp/store', { host: '127.0.0.1', port: 8080 }, '/proc/vsnap-state/serve');
      await record.stopLeftovers(1000);
      console.log(record.problem);`;
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { timeout: 120_000, killSignal: 'SIGKILL' });
    expect(stdout).toMatch(/cannot write \/proc\/vsnap-state\/serve\/engines-[0-9a-f]+\.json: ENOENT/);
  });
});
