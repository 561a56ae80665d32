import { request } from 'undici';

import { VsnapError } from '../../errors.js';
import { loadConfig } from '../../swap/config.js';
import { serve as runServe } from '../../swap/serve.js';
import type { Context } from '../context.js';
import { checkHttpUrl, EXIT, UsageError } from '../context.js';

/**
 * vsnap serve --config FILE: engines, the SwapController and the HTTP agent, until Ctrl-C (the
 * context's signal) or SIGTERM. The engines run in their own process groups, so Ctrl-C reaches
 * only vsnap, which then stops them (SIGTERM, then SIGKILL after the grace period).
 */
export async function serve(ctx: Context): Promise<number> {
  if (!ctx.options.config) throw new UsageError('serve needs --config <file> (YAML or JSON)');
  const config = loadConfig(ctx.options.config);
  const handle = await runServe(config);
  console.error(`vsnap: serving ${Object.keys(config.models).join(', ')} on ${handle.agent.url} (status page: ${handle.agent.url}/)`);
  if (ctx.json) ctx.print('', { url: handle.agent.url, models: Object.keys(config.models) });
  await new Promise<void>((resolve) => {
    const stop = (): void => resolve();
    if (ctx.signal.aborted) return resolve();
    ctx.signal.addEventListener('abort', stop, { once: true });
    process.once('SIGTERM', stop);
  });
  console.error('vsnap: stopping the agent and the engines');
  await handle.close();
  return EXIT.ok;
}

/** vsnap swap <model> [--agent URL] [--token T]: wake a model through a running agent (token: --token, else $VSNAP_CONTROL_TOKEN). */
export async function swap(ctx: Context): Promise<number> {
  const model = ctx.name('a model name');
  const agent = checkHttpUrl(ctx.options.agent ?? process.env.VSNAP_AGENT_URL ?? 'http://127.0.0.1:8080', ctx.options.agent !== undefined ? '--agent' : '$VSNAP_AGENT_URL', 'http://127.0.0.1:8080');
  const token = ctx.options.token ?? process.env.VSNAP_CONTROL_TOKEN;
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
    try {
      detail = (JSON.parse(body) as { error?: { message?: string } }).error?.message ?? body;
    } catch {
      // not JSON: shown as it is
    }
    throw new VsnapError('E_ENGINE_HTTP', `the agent at ${agent} answered ${r.statusCode}: ${detail}`, { status: r.statusCode });
  }
  ctx.print(`${model} is awake (${((performance.now() - started) / 1000).toFixed(2)} s)`, JSON.parse(body));
  return EXIT.ok;
}
