import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { EngineClient } from '../../src/engine/engine-client.js';
import { packageRoot } from '../../src/native/index.js';

// Paths from the package root, so this also works from the bundled GPU suite (dist-gpu/).
const fixture = join(packageRoot(), 'test', 'fixtures', 'engine');
const serve = join(fixture, 'serve.py');
const pluginSiteScript = join(fixture, 'plugin_site.py');

let pluginSite: string | undefined;
/** A PYTHONPATH entry where the vsnap plugin is installed (entry point included). */
export function pluginSitePath(): string {
  if (pluginSite === undefined) {
    const dir = mkdtempSync(join(tmpdir(), 'vsnap-plugin-site-'));
    process.once('exit', () => rmSync(dir, { recursive: true, force: true })); // one per test process, removed with it
    pluginSite = execFileSync('python3', [pluginSiteScript, dir], { encoding: 'utf8' }).trim();
  }
  return pluginSite;
}

export interface TestEngine {
  /** What the engine wrote to stderr so far. */
  stderr(): string;
  readonly url: string;
  readonly token: string;
  /** The API-server process (what was spawned). */
  readonly process: ChildProcess;
  /** Seconds the engine took to load its model (as serve.py reports it). */
  readonly loadSeconds: number;
  /** The engine-core process, which holds the GPU memory (the worker, as in vLLM, runs apart from the API server). */
  readonly enginePid: number;
  /** With tensorParallelSize > 1: the worker process of each rank, in rank order (else empty). */
  readonly workerPids: number[];
  stop(): Promise<void>;
}

export interface EngineOptions {
  /** `host` (CPU, the default) or `cuda` (needs VSNAP_REF_CUMEM_LIB and torch). */
  device?: 'host' | 'cuda';
  /** Extra arguments for serve.py (e.g. --layers, --hidden). */
  args?: string[];
  /** How long to wait for the engine to serve (default 20 s; 180 s for cuda). */
  startTimeoutMs?: number;
  seed?: number;
  model?: string;
  devMode?: boolean;
  plugin?: boolean;
  sleepMode?: boolean;
  token?: string | null;
  env?: Record<string, string>;
  /** Ranks (serve.py --tensor-parallel-size): > 1 runs one worker process per rank. */
  tensorParallelSize?: number;
}

/** Starts the CPU reference engine (test/fixtures/engine) with the vsnap plugin on an ephemeral port. */
export async function startEngine(options: EngineOptions = {}): Promise<TestEngine> {
  const token = options.token === undefined ? 'test-token-0123456789' : options.token;
  const seed = options.seed ?? 1;
  const device = options.device ?? 'host';
  const args = [serve, '--device', device, '--port', '0', '--seed', String(seed), '--revision', `seed-${seed}`, '--model', options.model ?? `vsnap/reference-${device}-${seed}`, ...(options.args ?? [])];
  if (options.sleepMode !== false) args.push('--enable-sleep-mode');
  if (options.tensorParallelSize !== undefined) args.push('--tensor-parallel-size', String(options.tensorParallelSize));
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    PYTHONPATH: options.plugin === false ? '' : pluginSitePath(),
    VLLM_PLUGINS: options.plugin === false ? '' : 'vsnap',
    ...(options.devMode === false ? {} : { VLLM_SERVER_DEV_MODE: '1' }),
    ...(token ? { VSNAP_TOKEN: token } : {}),
    ...(options.env ?? {}),
  };
  if (!token) delete env.VSNAP_TOKEN;
  const child = spawn('python3', args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [port, loadSeconds, enginePid, workerPids] = await new Promise<[number, number, number, number[]]>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /READY (\d+) ([\d.]+) (\d+) ([\d,]+|-)\n/.exec(out);
      if (m) resolve([Number(m[1]), Number(m[2]), Number(m[3]), m[4] === '-' ? [] : m[4]!.split(',').map(Number)]);
    });
    child.on('exit', (code) => reject(new Error(`the reference engine exited (${code}) before serving:\n${stderr}`)));
    const wait = options.startTimeoutMs ?? (device === 'cuda' ? 180_000 : 20_000);
    setTimeout(() => reject(new Error(`the reference engine did not start in ${wait / 1000} s:\n${stderr}`)), wait).unref();
  });
  return {
    stderr: () => stderr,
    url: `http://127.0.0.1:${port}`,
    token: token ?? '',
    process: child,
    loadSeconds,
    enginePid,
    workerPids,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.on('exit', r));
        child.kill('SIGTERM');
        await exited;
      }
      // The engine core leaves when its pipe to the API server closes, and its workers with it;
      // wait for them (they hold the memory).
      for (const pid of [enginePid, ...workerPids]) {
        for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
        if (alive(pid)) process.kill(pid, 'SIGKILL');
      }
    },
  };
}

/** Whether a process with this pid runs (a zombie, exited but not yet reaped by its parent, does not). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    // /proc/<pid>/stat: "pid (comm) S ...", S the state; the comm may hold spaces and parentheses
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** The engine's greedy answer to the probe prompt: its token ids and their logprobs. */
export async function askCapital(client: EngineClient, maxTokens: number): Promise<{ ids: number[] | null; logprobs: number[] | null }> {
  const r = await client.completions({ prompt: 'The capital of France is', max_tokens: maxTokens, logprobs: 1 });
  return { ids: r.tokenIds, logprobs: r.logprobs };
}

/**
 * An RL trainer's weight sync through vLLM's native API (dev routes of the rlhf router: pause,
 * init_weight_transfer_engine, start_weight_update, update_weights, finish_weight_update, resume),
 * in place: the weights of `layers` (all when omitted) become those of `seed`. The reference
 * engine's update_info names a seed where vLLM's backends carry tensors.
 */
export async function syncWeights(url: string, seed: number, layers?: number[]): Promise<void> {
  const post = async (path: string, body?: unknown) => {
    const r = await fetch(url + path, { method: 'POST', ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } }) });
    if (!r.ok) throw new Error(`POST ${path} answered ${r.status}: ${await r.text()}`);
  };
  await post('/pause?mode=wait');
  try {
    await post('/init_weight_transfer_engine', { init_info: { backend: 'reference' } });
    await post('/start_weight_update');
    await post('/update_weights', { update_info: { seed, layers: layers ?? null } });
    await post('/finish_weight_update');
  } finally {
    await post('/resume');
  }
}

let numpyHere: boolean | undefined;
/**
 * Whether the reference engine's workers digest their own weights (the plugin's `digest`: numpy
 * on host memory), so a suspend's dirty check makes no export. numpy is a test prerequisite that
 * `.ci/run` installs: with CI=true its absence fails here; elsewhere the tests that need it skip
 * and the others expect the export form.
 */
export function engineDigests(): boolean {
  if (numpyHere === undefined) numpyHere = spawnSync('python3', ['-c', 'import numpy'], { stdio: 'ignore' }).status === 0;
  if (!numpyHere && process.env.CI === 'true') {
    throw new Error('python3 cannot import numpy: the reference engine digests its weights with it (pip install numpy; .ci/run does)');
  }
  return numpyHere;
}

/** The dirty-check phases of a suspend, in the order they run: the engine's digest, or the export form. */
export const dirtyCheckPhases = (): string[] => (engineDigests() ? ['digest', 'check'] : ['check', 'digest']);
