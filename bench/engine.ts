// The reference engine the swap bench runs (test/fixtures/engine, shipped with the package), and
// the few calls to it the bench makes itself: the probe question and vLLM's own dev routes.
// Paths from the package root above this file (bench/ or the bundle's dist-gpu/).
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The checkout the bench runs from: one folder above this file, bundled or not. */
export const packageRoot = (): string => dirname(dirname(fileURLToPath(import.meta.url)));
const fixture = (): string => join(packageRoot(), 'test', 'fixtures', 'engine');

export interface ReferenceEngine {
  readonly url: string;
  readonly token: string;
  /** The engine-core process, which holds the GPU memory. */
  readonly enginePid: number;
  stop(): Promise<void>;
}

/** A PYTHONPATH entry where the vsnap plugin is installed (its entry point included); removed at exit. */
function pluginSite(): string {
  const dir = mkdtempSync(join(tmpdir(), 'vsnap-plugin-site-'));
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  return execFileSync('python3', [join(fixture(), 'plugin_site.py'), dir], { encoding: 'utf8' }).trim();
}
let site: string | undefined;

/** Starts the reference engine with the vsnap plugin and sleep mode on an ephemeral port. */
export async function startEngine(o: { device: 'cuda' | 'host'; seed: number; model: string; args: string[]; startTimeoutMs: number }): Promise<ReferenceEngine> {
  const serve = join(fixture(), 'serve.py');
  if (!existsSync(serve)) throw new Error(`the reference engine is not at ${serve}: run the bench from a vsnap checkout (bench/ or dist-gpu/)`);
  site ??= pluginSite();
  const token = 'bench-token-0123456789';
  const args = [serve, '--device', o.device, '--port', '0', '--seed', String(o.seed), '--revision', `seed-${o.seed}`, '--model', o.model, ...o.args, '--enable-sleep-mode'];
  const env = { ...process.env, PYTHONPATH: site, VLLM_PLUGINS: 'vsnap', VLLM_SERVER_DEV_MODE: '1', VSNAP_TOKEN: token };
  const child = spawn('python3', args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [port, enginePid, workerPids] = await new Promise<[number, number, number[]]>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /READY (\d+) ([\d.]+) (\d+) ([\d,]+|-)\n/.exec(out);
      if (m) resolve([Number(m[1]), Number(m[3]), m[4] === '-' ? [] : m[4]!.split(',').map(Number)]);
    });
    child.on('exit', (code) => reject(new Error(`the reference engine exited (${code}) before serving:\n${stderr}`)));
    setTimeout(() => reject(new Error(`the reference engine did not start in ${o.startTimeoutMs / 1000} s:\n${stderr}`)), o.startTimeoutMs).unref();
  });
  return {
    url: `http://127.0.0.1:${port}`,
    token,
    enginePid,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.on('exit', r));
        child.kill('SIGTERM');
        await exited;
      }
      // The engine core and its workers leave when their pipe to the API server closes; they hold the memory.
      for (const pid of [enginePid, ...workerPids]) {
        for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
        if (alive(pid)) process.kill(pid, 'SIGKILL');
      }
    },
  };
}

/** Whether a process runs (a zombie does not). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

async function call(url: string, method: 'GET' | 'POST', path: string, body?: unknown): Promise<unknown> {
  const r = await fetch(url + path, { method, ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } }) });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path} answered ${r.status}: ${text.slice(0, 300)}`);
  return text ? JSON.parse(text) : null;
}

export type Answer = { ids: number[] | null; logprobs: number[] | null };

/** The engine's greedy answer to the probe prompt: its token ids and their logprobs. */
export async function askCapital(url: string, maxTokens: number): Promise<Answer> {
  const r = (await call(url, 'POST', '/v1/completions', { prompt: 'The capital of France is', max_tokens: maxTokens, logprobs: 1, temperature: 0, return_tokens_as_token_ids: true })) as {
    choices: Array<{ logprobs?: { tokens: string[]; token_logprobs: Array<number | null> } | null }>;
  };
  const lp = r.choices[0]?.logprobs;
  const ids = lp?.tokens.every((t) => /^token_id:\d+$/.test(t)) ? lp.tokens.map((t) => Number(t.slice(9))) : null;
  return { ids, logprobs: lp ? lp.token_logprobs.map((x) => x ?? Number.NaN) : null };
}

/** vLLM's own dev routes (VLLM_SERVER_DEV_MODE=1): the level-1 sleep the vllm-l1 row measures. */
export const vllmRoutes = (url: string) => ({
  isSleeping: async (): Promise<boolean> => ((await call(url, 'GET', '/is_sleeping')) as { is_sleeping: boolean }).is_sleeping,
  sleep: async (level: 1 | 2): Promise<void> => void (await call(url, 'POST', `/sleep?level=${level}`)),
  wakeUp: async (): Promise<void> => void (await call(url, 'POST', '/wake_up')),
});

/**
 * Why the engine's own tier 0 cannot run on VSNAP_VLLM_SRC's allocator, or undefined when it can
 * (or none is set: the stand-in's allocator has discard). vLLM's release_kv_cache_memory ends in
 * the allocator's discard(tags), which came with it.
 */
export function engineTierUnsupported(src: string | undefined = process.env['VSNAP_VLLM_SRC']): string | undefined {
  const cumem = src ? [join(src, 'vllm/device_allocator/cumem.py'), join(src, 'vllm/backends/platform/device_allocator/cumem.py')].find((f) => existsSync(f)) : undefined;
  if (!cumem || /def discard\(/.test(readFileSync(cumem, 'utf8'))) return undefined;
  return `VSNAP_VLLM_SRC's allocator (${cumem}) has no discard(tags): it predates release_kv_cache_memory; run without VSNAP_VLLM_SRC for this`;
}
