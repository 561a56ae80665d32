import { request } from 'undici';

import { VsnapError } from '../../errors.js';
import { loadConfig } from '../../serve/config.js';
import { serve as runServe } from '../../serve/serve.js';
import { agentUrl, controlToken } from '../../settings.js';
import type { Context } from '../context.js';
import { checkHttpUrl, EXIT, UsageError } from '../context.js';

/**
 * vsnap serve --config FILE: engines, the SwapController and the HTTP agent, until Ctrl-C (the
 * context's signal), SIGTERM or SIGHUP, whichever comes first, during the boot too: the
 * handlers are installed before anything starts, and a stop during the boot stops the engines
 * started so far. The engines run in their own process groups, so Ctrl-C reaches only vsnap,
 * which then stops them (SIGTERM, then SIGKILL after the grace period); they also get a
 * parent-death signal, so a vsnap that is killed outright takes them with it. Exits 1 when an
 * engine cannot be booted (after stopping the rest).
 */
export async function serve(ctx: Context): Promise<number> {
  if (!ctx.options.config) throw new UsageError('serve needs --config <file> (YAML or JSON)');
  const config = loadConfig(ctx.options.config);
  let stopBy: string | undefined;
  let onStop: () => void = () => undefined;
  const stopped = new Promise<void>((resolve) => (onStop = resolve));
  const stop = (why: string) => (): void => {
    stopBy ??= why;
    onStop();
  };
  const onTerm = stop('SIGTERM');
  const onHup = stop('SIGHUP');
  const onAbort = stop('SIGINT');
  process.on('SIGTERM', onTerm);
  process.on('SIGHUP', onHup);
  if (ctx.signal.aborted) onAbort();
  ctx.signal.addEventListener('abort', onAbort, { once: true });
  try {
    const handle = await runServe(config);
    try {
      if (stopBy) return stopping(stopBy);
      const models = Object.keys(config.models);
      console.error(`vsnap: listening on ${handle.agent.url}; starting ${models.join(', ')} (status page: ${handle.agent.url}/)`);
      const first = await Promise.race([stopped.then(() => 'stop' as const), handle.booted.then(() => 'booted' as const, (err: unknown) => err)]);
      if (first !== 'stop' && first !== 'booted') {
        console.error('vsnap: the boot failed: stopping the agent and the engines');
        throw first;
      }
      if (first === 'booted') {
        console.error(`vsnap: serving ${models.join(', ')} on ${handle.agent.url} (status page: ${handle.agent.url}/)`);
        if (ctx.json) ctx.print('', { url: handle.agent.url, models });
        await stopped;
      }
      return stopping(stopBy ?? 'SIGTERM');
    } finally {
      await handle.close();
    }
  } finally {
    process.off('SIGTERM', onTerm);
    process.off('SIGHUP', onHup);
    ctx.signal.removeEventListener('abort', onAbort);
  }
}

/** A stop asked for by a signal: said, and a clean exit (the caller's close() stops the engines). */
function stopping(by: string): number {
  console.error(`vsnap: stopping the agent and the engines (${by})`);
  return EXIT.ok;
}

/** vsnap swap <model> [--agent URL] [--token T]: wake a model through a running agent (token: --token, else $VSNAP_CONTROL_TOKEN). */
export async function swap(ctx: Context): Promise<number> {
  const model = ctx.name('a model name');
  const agent = checkHttpUrl(ctx.options.agent ?? agentUrl() ?? 'http://127.0.0.1:8080', ctx.options.agent !== undefined ? '--agent' : '$VSNAP_AGENT_URL', 'http://127.0.0.1:8080');
  const token = ctx.options.token ?? controlToken();
  const started = performance.now();
  const r = await request(`${agent.replace(/\/+$/, '')}/engines/${encodeURIComponent(model)}/restore`, {
    method: 'POST',
    headers: token ? { authorization: `Bearer ${token}` } : {},
    signal: ctx.signal,
  }).catch((err: Error) => {
    throw new VsnapError('E_ENGINE_UNREACHABLE', `cannot reach the agent at ${agent}: ${err.message}`);
  });
  const body = await r.body.text();
  if (r.statusCode !== 200) {
    let detail = body;
    let agentCode: string | undefined;
    try {
      const error = (JSON.parse(body) as { error?: { message?: string; code?: string; vsnap_code?: string } }).error;
      detail = error?.message ?? body;
      agentCode = error?.vsnap_code ?? error?.code;
    } catch {
      // not JSON: shown as it is
    }
    // a model the agent does not serve is not an HTTP problem: its own code, and its own hint
    if (agentCode === 'E_UNKNOWN_MODEL') throw new VsnapError('E_UNKNOWN_MODEL', `the agent at ${agent} answered ${r.statusCode}: ${detail}`, { status: r.statusCode, model });
    throw new VsnapError('E_ENGINE_HTTP', `the agent at ${agent} answered ${r.statusCode}: ${detail}`, { status: r.statusCode, ...(agentCode ? { agentCode } : {}) });
  }
  ctx.print(`${model} is awake (${((performance.now() - started) / 1000).toFixed(2)} s)`, JSON.parse(body));
  return EXIT.ok;
}
