import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { mkdirParents } from '../store/fsutil.js';

/** A process as the record names it: its pid and its start time (so a reused pid is never taken for it). @internal */
export interface RecordedProcess {
  readonly pid: number;
  /** Field 22 of /proc/<pid>/stat: clock ticks since boot when it started. */
  readonly startTime: string;
}

interface RecordFile {
  readonly version: 1;
  /** /proc/sys/kernel/random/boot_id: a record from before a reboot names no live process. */
  readonly bootId: string;
  /** The `vsnap serve` that wrote it. */
  readonly owner: RecordedProcess;
  /** The engines it started (each leads its own process group). */
  readonly engines: Array<RecordedProcess & { readonly name: string }>;
}

/** What {@link EngineRecord.stopLeftovers} found. @internal */
export interface LeftoverReport {
  /** Engines of a serve that died, stopped now (their process groups). */
  readonly stopped: Array<{ name: string; pid: number; processes: number; killed: boolean }>;
  /** Set when the serve that wrote the record still runs: its engines were left alone. */
  readonly ownerRunning?: number;
}

/**
 * The engines a `vsnap serve` started, in a file of its state directory (one per store and
 * listen address), written as each starts and exits. A serve that dies without stopping them
 * (SIGKILL, a crash) leaves the file behind: the next serve with the same store and address
 * reads it at start-up and stops what is still running, after checking each pid is still that
 * process (same start time, same boot) and that the serve that wrote it is gone.
 * @internal
 */
export class EngineRecord {
  private engines: Array<RecordedProcess & { name: string }> = [];
  private owned = false;
  /** Why the record cannot be written (its directory is read-only, say): serve then runs without one. */
  problem: string | undefined;

  constructor(readonly path: string) {}

  /** The record of the serve with this store and listen address, under `stateDir` (default $XDG_STATE_HOME/vsnap/serve). */
  static forServe(store: string, listen: { host: string; port: number }, stateDir = defaultStateDir()): EngineRecord {
    const key = createHash('sha256').update(`${resolve(store)}\0${listen.host}\0${listen.port}`).digest('hex').slice(0, 16);
    return new EngineRecord(join(stateDir, `engines-${key}.json`));
  }

  /**
   * Stops the engines a dead serve left (SIGTERM to each process group, SIGKILL after `graceMs`)
   * and takes the record over. When the serve that wrote it still runs (another process, or one
   * not closed in this one), leaves everything alone and records nothing.
   */
  async stopLeftovers(graceMs: number): Promise<LeftoverReport> {
    const previous = this.read();
    if (previous && previous.bootId === bootId() && isRunning(previous.owner)) {
      return { stopped: [], ownerRunning: previous.owner.pid };
    }
    const stopped: LeftoverReport['stopped'] = [];
    if (previous && previous.bootId === bootId()) {
      for (const e of previous.engines) {
        const group = leftoverGroup(e);
        if (group.length === 0) continue;
        const killed = await stopGroup(e.pid, graceMs);
        stopped.push({ name: e.name, pid: e.pid, processes: group.length, killed });
      }
    }
    this.owned = true;
    this.engines = [];
    this.write();
    return { stopped };
  }

  /** An engine started (its pid leads its process group). */
  started(name: string, pid: number): void {
    const startTime = startTimeOf(pid);
    if (startTime === undefined) return; // already gone
    this.engines = [...this.engines.filter((e) => e.pid !== pid), { name, pid, startTime }];
    this.write();
  }

  /** An engine's process exited (its group may still hold processes: kept until stopped). */
  exited(pid: number): void {
    const e = this.engines.find((x) => x.pid === pid);
    if (!e || leftoverGroup(e).length > 0) return;
    this.engines = this.engines.filter((x) => x.pid !== pid);
    this.write();
  }

  /** Every engine was stopped: the record goes. */
  remove(): void {
    if (!this.owned) return;
    this.engines = [];
    rmSync(this.path, { force: true });
    this.owned = false;
  }

  private read(): RecordFile | undefined {
    try {
      const r = JSON.parse(readFileSync(this.path, 'utf8')) as RecordFile;
      return r.version === 1 && Array.isArray(r.engines) && typeof r.owner?.pid === 'number' ? r : undefined;
    } catch {
      return undefined;
    }
  }

  /** Atomic replace: a crash leaves the old record or the new one. A record that cannot be written is given up (see `problem`). */
  private write(): void {
    if (!this.owned) return;
    const self = { pid: process.pid, startTime: startTimeOf(process.pid) ?? '' };
    const body: RecordFile = { version: 1, bootId: bootId(), owner: self, engines: this.engines };
    try {
      mkdirParents(join(this.path, '..'), 0o700); // not mkdirSync's recursive form, which never returns under /proc
      const tmp = `${this.path}.${process.pid}.tmp`;
      writeFileSync(tmp, `${JSON.stringify(body)}\n`, { mode: 0o600 });
      renameSync(tmp, this.path);
    } catch (err) {
      this.problem = `cannot write ${this.path}: ${(err as Error).message}`;
      this.owned = false;
    }
  }
}

function defaultStateDir(): string {
  return join(process.env.XDG_STATE_HOME || join(homedir(), '.local', 'state'), 'vsnap', 'serve');
}

let boot: string | undefined;
function bootId(): string {
  if (boot === undefined) {
    try {
      boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    } catch {
      boot = '';
    }
  }
  return boot;
}

interface ProcStat {
  readonly state: string;
  readonly pgrp: number;
  readonly startTime: string;
}

/** /proc/<pid>/stat's state, process group and start time (the command may hold spaces and parentheses: read after the last ')'). */
function statOf(pid: number | string): ProcStat | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return { state: f[0]!, pgrp: Number(f[2]), startTime: f[19]! };
  } catch {
    return undefined;
  }
}

function startTimeOf(pid: number): string | undefined {
  return statOf(pid)?.startTime;
}

/** Whether a recorded process is that process, still running (a zombie is not). */
export function isRunning(p: RecordedProcess): boolean {
  const s = statOf(p.pid);
  return s !== undefined && s.state !== 'Z' && s.startTime === p.startTime;
}

/** Live processes (not zombies) in process group `pgid`. */
function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const s = statOf(name);
    if (s && s.pgrp === pgid && s.state !== 'Z') out.push(Number(name));
  }
  return out;
}

/**
 * The live processes of a recorded engine's group. Its leader is that engine when the pid has
 * its start time; when the leader is gone, a group with its id can only still be its (Linux does
 * not hand out a pid that is still some group's id); a pid reused by another process means the
 * group is gone.
 */
function leftoverGroup(e: RecordedProcess): number[] {
  const leader = statOf(e.pid);
  if (leader && leader.startTime !== e.startTime) return [];
  return groupMembers(e.pid);
}

/** SIGTERM to the group, SIGKILL after `graceMs`; waits until it is gone. Returns whether SIGKILL was needed. */
async function stopGroup(pgid: number, graceMs: number): Promise<boolean> {
  const signal = (s: NodeJS.Signals): void => {
    try {
      process.kill(-pgid, s);
    } catch {
      // gone meanwhile
    }
  };
  signal('SIGTERM');
  const deadline = Date.now() + graceMs;
  while (groupMembers(pgid).length > 0 && Date.now() < deadline) await sleep(50);
  if (groupMembers(pgid).length === 0) return false;
  signal('SIGKILL');
  for (let i = 0; i < 200 && groupMembers(pgid).length > 0; i++) await sleep(50);
  return true;
}
