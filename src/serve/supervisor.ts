import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { accessSync, constants as fsConstants, statSync } from 'node:fs';
import { delimiter, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';

import { request } from 'undici';

import { VsnapError } from '../errors.js';
import { parentDeathWrapper } from './parent-death.js';

/**
 * An engine process the supervisor runs.
 * @public
 */
export interface SupervisedEngine {
  /** Its name (log prefix, events). */
  readonly name: string;
  /** The program, e.g. `vllm`. */
  readonly command: string;
  /** Its arguments. */
  readonly args: readonly string[];
  /** Environment added to this process's. */
  readonly env?: Readonly<Record<string, string>>;
  /** Its base URL (health is polled there). */
  readonly url: string;
  /** Default /health. */
  readonly healthPath?: string;
}

/**
 * Options of {@link Supervisor}.
 * @public
 */
export interface SupervisorOptions {
  /** How long an engine may take to become healthy (default 15 minutes: loading is slow). */
  readonly healthTimeoutMs?: number;
  /** SIGTERM, then SIGKILL after this long (default 20 s). */
  readonly graceMs?: number;
  /** First restart delay after a crash, doubled each time up to 60 s (default 1 s). */
  readonly restartDelayMs?: number;
  /** Crashes in a row after which an engine is given up (default 5). */
  readonly maxRestarts?: number;
  /** Where engine output lines go (default: stderr, prefixed with `[name]`). */
  readonly log?: (engine: string, line: string) => void;
  /**
   * The signal each engine gets when this process dies, however it dies (SIGKILL included):
   * Linux's parent-death signal, set through `setpriv --pdeathsig` or python3 before the
   * engine's command is executed (see {@link Supervisor.parentDeath}). Default SIGTERM (vLLM
   * then stops its own workers); false: engines outlive this process.
   */
  readonly parentDeathSignal?: NodeJS.Signals | false;
}

/**
 * An engine process as the supervisor sees it.
 * @public
 */
export interface EngineProcessState {
  /** The engine's name. */
  readonly name: string;
  /** `starting` until healthy, `running`, `restarting` after a crash, `gaveUp` after too many, `stopped`. */
  readonly status: 'starting' | 'running' | 'restarting' | 'gaveUp' | 'stopped';
  /** Its process id while it runs. */
  readonly pid?: number;
  /** Crashes in a row. */
  readonly restarts: number;
}

interface Running {
  spec: SupervisedEngine;
  child?: ChildProcess;
  restarts: number;
  stopping: boolean;
  status: EngineProcessState['status'];
  /** Why spawn itself failed (ENOENT, EACCES), when it did. */
  spawnError?: NodeJS.ErrnoException;
}

/**
 * Starts engine processes and keeps them running: a sequenced boot (one engine at a time: start
 * it, wait until it is healthy, run `onReady` — typically capture a snapshot if none matches
 * and suspend it — then the next, so engines never load at the same time), restarts with
 * backoff after a crash, a clean stop (SIGTERM, then SIGKILL after a grace period), and their
 * output forwarded line by line with a prefix. Each engine runs in its own process group and,
 * where the machine allows, gets a parent-death signal, so it does not outlive this process
 * (see {@link SupervisorOptions.parentDeathSignal}). Emits `spawn` (name, pid: as soon as a
 * process is started), `ready`, `exit` (name, code, signal, pid), `restart`, `gaveUp`.
 * @public
 */
export class Supervisor extends EventEmitter {
  private readonly engines = new Map<string, Running>();
  private readonly options: SupervisorOptions;
  private onRestart: ((name: string) => Promise<void>) | undefined;
  private stopped = false;
  /**
   * How engines are made to die with this process: `setpriv` or `python3` (the program that sets
   * the parent-death signal before executing the engine), `off` when not asked for, `unavailable`
   * when this machine has neither program (engines then outlive a SIGKILL of this process).
   */
  readonly parentDeath: 'setpriv' | 'python3' | 'off' | 'unavailable';
  /** If this process exits without stop() (a second Ctrl-C, process.exit), its engines go with it. */
  private readonly killOnExit = (): void => {
    for (const r of this.engines.values()) {
      if (r.child && r.child.exitCode === null && r.child.signalCode === null) signalGroup(r.child, 'SIGKILL');
    }
  };

  constructor(engines: readonly SupervisedEngine[], options: SupervisorOptions = {}) {
    super();
    this.options = options;
    this.parentDeath = options.parentDeathSignal === false ? 'off' : ((parentDeathWrapper()?.program as 'setpriv' | 'python3' | undefined) ?? 'unavailable');
    for (const e of engines) this.engines.set(e.name, { spec: e, restarts: 0, stopping: false, status: 'stopped' });
  }

  /**
   * Boots the engines one at a time. `onReady(name)` runs after each is healthy, before the next
   * starts; `onRestart(name)` after an engine came back from a crash. Throws E_CONFIG before
   * starting any when an engine's command is not an executable (on its PATH, or at its path).
   */
  async start(hooks: { onReady?: (name: string) => Promise<void>; onRestart?: (name: string) => Promise<void> } = {}): Promise<void> {
    this.onRestart = hooks.onRestart;
    // a command that is not there is said for every engine before any starts (not as an exit code later)
    for (const running of this.engines.values()) checkCommand(running.spec);
    process.once('exit', this.killOnExit);
    for (const running of this.engines.values()) {
      if (this.stopped) throw new VsnapError('E_ABORTED', `the boot was stopped before engine '${running.spec.name}' started`, { engine: running.spec.name });
      this.launch(running);
      await this.waitHealthy(running);
      running.status = 'running';
      await hooks.onReady?.(running.spec.name);
      this.emit('ready', { name: running.spec.name });
    }
  }

  /** Stops every engine: SIGTERM, then SIGKILL after the grace period. A boot in progress stops too (its start() rejects). */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all([...this.engines.values()].map((r) => this.kill(r)));
    process.off('exit', this.killOnExit);
  }

  /** Every engine's process state (for `/healthz` and the status page). */
  states(): EngineProcessState[] {
    return [...this.engines.values()].map((r) => ({
      name: r.spec.name,
      status: r.status,
      restarts: r.restarts,
      ...(r.child?.pid !== undefined && r.child.exitCode === null && r.child.signalCode === null ? { pid: r.child.pid } : {}),
    }));
  }

  /** The pid of an engine's process, if it runs. */
  pid(name: string): number | undefined {
    return this.engines.get(name)?.child?.pid;
  }

  private launch(running: Running): void {
    const { spec } = running;
    // Its own process group: Ctrl-C in vsnap's terminal does not reach it; vsnap stops it (SIGTERM) itself.
    // With the parent-death signal, a wrapper sets it and then executes the command in the same process (same pid).
    const wrapper = this.parentDeath === 'setpriv' || this.parentDeath === 'python3' ? parentDeathWrapper() : undefined;
    const signal = this.options.parentDeathSignal || 'SIGTERM';
    const [command, args] = wrapper ? [wrapper.program, wrapper.args(signal, spec.command, spec.args)] : [spec.command, [...spec.args]];
    const child = spawn(command, args, { env: { ...process.env, ...(spec.env ?? {}) }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    running.child = child;
    delete running.spawnError;
    if (child.pid !== undefined) this.emit('spawn', { name: spec.name, pid: child.pid });
    running.status = 'starting';
    const log = this.options.log ?? ((name: string, line: string) => process.stderr.write(`[${name}] ${line}\n`));
    for (const stream of [child.stdout, child.stderr]) {
      if (stream) createInterface({ input: stream }).on('line', (line) => log(spec.name, line));
    }
    child.on('error', (err: NodeJS.ErrnoException) => {
      running.spawnError = err;
      log(spec.name, `could not start ${spec.command}: ${err.message}`);
    });
    child.on('exit', (code, signal) => {
      this.emit('exit', { name: spec.name, code, signal, pid: child.pid });
      if (running.stopping || this.stopped) {
        running.status = 'stopped';
        return;
      }
      running.status = 'restarting';
      void this.restart(running);
    });
  }

  private async restart(running: Running): Promise<void> {
    running.restarts++;
    const max = this.options.maxRestarts ?? 5;
    if (running.restarts > max) {
      running.status = 'gaveUp';
      this.emit('gaveUp', { name: running.spec.name, restarts: running.restarts - 1 });
      return;
    }
    const delayMs = Math.min(60_000, (this.options.restartDelayMs ?? 1000) * 2 ** (running.restarts - 1));
    this.emit('restart', { name: running.spec.name, attempt: running.restarts, delayMs });
    await sleep(delayMs);
    if (this.stopped) return;
    this.launch(running);
    try {
      await this.waitHealthy(running);
      running.restarts = 0;
      running.status = 'running';
      await this.onRestart?.(running.spec.name);
    } catch {
      // it died again (the exit handler restarts it) or never became healthy
    }
  }

  private async waitHealthy(running: Running): Promise<void> {
    const { spec } = running;
    const timeoutMs = this.options.healthTimeoutMs ?? 15 * 60_000;
    const deadline = Date.now() + timeoutMs;
    const url = spec.url.replace(/\/+$/, '') + (spec.healthPath ?? '/health');
    for (;;) {
      const child = running.child;
      if (this.stopped) throw new VsnapError('E_ABORTED', `engine '${spec.name}' was stopped before it was healthy`, { engine: spec.name });
      if (child && (child.exitCode !== null || child.signalCode !== null)) {
        // spawn's ENOENT (exit code -2), or the parent-death wrapper's "cannot execute" (127: setpriv and shells)
        if (running.spawnError?.code === 'ENOENT' || child.exitCode === 127) checkCommand(spec);
        if (running.spawnError) {
          throw new VsnapError('E_ENGINE_STATE', `engine '${spec.name}': its command '${spec.command}' could not be started (${running.spawnError.code ?? running.spawnError.message}); check \`command:\` for ${spec.name} in the configuration`, { engine: spec.name, command: spec.command });
        }
        const how = child.exitCode !== null ? `code ${child.exitCode}` : child.signalCode!;
        throw new VsnapError('E_ENGINE_STATE', `engine '${spec.name}' exited (${how}) before it was healthy; see its log lines above`, { engine: spec.name });
      }
      try {
        const r = await request(url, { headersTimeout: 5000, bodyTimeout: 5000 });
        await r.body.dump();
        if (r.statusCode === 200) return;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) {
        throw new VsnapError('E_TIMEOUT', `engine '${spec.name}' was not healthy at ${url} within ${timeoutMs} ms`, { engine: spec.name });
      }
      await sleep(250);
    }
  }

  private async kill(running: Running): Promise<void> {
    running.stopping = true;
    const child = running.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    signalGroup(child, 'SIGTERM');
    const timer = new AbortController(); // cancelled once it exits, so no timer outlives the stop
    const grace = sleep(this.options.graceMs ?? 20_000, 'timeout' as const, { signal: timer.signal }).catch(() => 'cancelled' as const);
    const first = await Promise.race([exited.then(() => 'exited' as const), grace]);
    timer.abort();
    if (first === 'timeout') {
      signalGroup(child, 'SIGKILL');
      await exited;
    }
  }
}

/**
 * Throws E_CONFIG naming the engine and its command when the command is not an executable file:
 * a path (with a slash) from this process's directory, else a name on the PATH the engine gets.
 * @internal
 */
export function checkCommand(spec: Pick<SupervisedEngine, 'name' | 'command' | 'env'>): void {
  const path = spec.env?.PATH ?? process.env.PATH ?? '';
  const candidates = spec.command.includes('/') ? [resolve(spec.command)] : path.split(delimiter).filter((d) => d !== '').map((d) => join(d, spec.command));
  for (const file of candidates) {
    try {
      accessSync(file, fsConstants.X_OK);
      if (statSync(file).isFile()) return;
    } catch {
      // not here
    }
  }
  const where = spec.command.includes('/') ? `no executable file at ${resolve(spec.command)}` : `not found on PATH (${path || 'empty'})`;
  throw new VsnapError(
    'E_CONFIG',
    `engine '${spec.name}': its command '${spec.command}' was not found: ${where}. Set \`command:\` for ${spec.name} in the configuration to the engine's program (a name on PATH, or an absolute path)`,
    { engine: spec.name, command: spec.command },
  );
}

/** Signals the child's whole process group (it leads one: `detached`), so its workers stop with it. */
function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  try {
    if (child.pid !== undefined) process.kill(-child.pid, signal);
    else child.kill(signal);
  } catch {
    child.kill(signal);
  }
}
