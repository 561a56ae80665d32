import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { packageRoot } from '../../src/native/index.js';
import { cliPath } from './cli.js';
import { pluginSitePath } from './engine.js';
import { freePort } from './net.js';

/** A `vsnap serve` run in a child process (the built CLI), its stderr collected. */
export interface ServeProcess {
  readonly child: ChildProcess;
  log(): string;
  /** Resolves with the exit code and signal. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Waits until the log matches (rejects if the process exits first); the test's timeout bounds it. */
  waitFor(pattern: RegExp): Promise<RegExpExecArray>;
}

/** A serve configuration of `n` reference engines (CPU, the vsnap plugin) that vsnap starts, one GPU whose budget fits one awake. */
export async function referenceServeConfig(dir: string, n: number, listenPort?: number): Promise<{ file: string; ports: number[]; listenPort: number }> {
  const serve = join(packageRoot(), 'test', 'fixtures', 'engine', 'serve.py');
  const env = { PYTHONPATH: pluginSitePath(), VLLM_PLUGINS: 'vsnap' };
  const ports: number[] = [];
  const models: Record<string, unknown> = {};
  for (let i = 1; i <= n; i++) {
    const port = await freePort();
    ports.push(port);
    models[`m${i}`] = {
      command: 'python3',
      args: [serve, '--device', 'host', '--port', '${PORT}', '--seed', String(i), '--model', `m${i}`, '--enable-sleep-mode', '--layers', '2'],
      env,
      port,
      token: `engine-token-${i}`,
      memoryGiB: 10,
    };
  }
  const port = listenPort ?? (await freePort());
  const file = join(dir, 'serve.json');
  writeFileSync(file, JSON.stringify({ listen: { port }, store: join(dir, 'store'), startup: { graceSeconds: 5 }, gpus: { 0: { budgetGiB: 15 } }, models }, null, 2));
  return { file, ports, listenPort: port };
}

/** Starts `vsnap serve --config file` with XDG_STATE_HOME at `stateHome` (where it records its engines). */
export function startServe(file: string, stateHome: string): ServeProcess {
  const child = spawn(process.execPath, [cliPath, 'serve', '--config', file], { env: { ...process.env, XDG_STATE_HOME: stateHome }, stdio: ['ignore', 'ignore', 'pipe'] });
  let text = '';
  child.stderr!.on('data', (d: Buffer) => (text += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  return {
    child,
    log: () => text,
    exited,
    waitFor: (pattern) =>
      new Promise((resolve, reject) => {
        const t = setInterval(() => {
          const m = pattern.exec(text);
          if (m) {
            clearInterval(t);
            resolve(m);
          } else if (child.exitCode !== null || child.signalCode !== null) {
            clearInterval(t);
            reject(new Error(`vsnap serve exited (${child.exitCode ?? child.signalCode}) before ${pattern}:\n${text}`));
          }
        }, 25);
      }),
  };
}

/** The engines the serve's record names now (pid: the leader of the engine's process group). */
export function recordedEngines(stateHome: string): Array<{ name: string; pid: number; startTime: string }> {
  const dir = join(stateHome, 'vsnap', 'serve');
  let files: string[] = [];
  try {
    files = readdirSync(dir).filter((f) => /^engines-[0-9a-f]+\.json$/.test(f));
  } catch {
    return [];
  }
  return files.flatMap((f) => {
    try {
      return (JSON.parse(readFileSync(join(dir, f), 'utf8')) as { engines: Array<{ name: string; pid: number; startTime: string }> }).engines;
    } catch {
      return []; // being replaced (rename is atomic; a read between is retried by the caller)
    }
  });
}

/** Live (not zombie) processes of process group `pgid`: an engine and its children. */
export function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const text = readFileSync(`/proc/${name}/stat`, 'utf8');
      const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
      if (Number(f[2]) === pgid && f[0] !== 'Z') out.push(Number(name));
    } catch {
      // gone
    }
  }
  return out;
}

/** Polls until `check` holds (the caller's timeout bounds it: no threshold here). */
export async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 25));
}
