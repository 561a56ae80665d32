import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

import { VsnapError } from '../../errors.js';
import { cudaStatus } from '../../gpu/cuda.js';
import { packageRoot } from '../../native/index.js';
import type { Context } from '../context.js';
import { EXIT, UsageError } from '../context.js';

/**
 * vsnap bench [--gib N] [--out dir] [--gpus N] [--drop-caches] | bench swap [options]: the
 * benchmarks (a source checkout, an NVIDIA GPU). Results are written only under --out; the page
 * cache is dropped only with --drop-caches.
 */
export async function bench(ctx: Context): Promise<number> {
  const script = join(packageRoot(), 'bench', 'run.sh');
  const cannot = (code: 'E_INVALID_ARGUMENT' | 'E_CUDA_UNAVAILABLE', why: string): number => {
    if (ctx.json) throw new VsnapError(code, why); // {"code", "message", "hint"} on stdout
    console.error(`vsnap: ${why}`); // one line: why it cannot run
    return EXIT.failed;
  };
  if (!existsSync(script)) return cannot('E_INVALID_ARGUMENT', 'bench runs from a source checkout of vsnap (bench/run.sh is not in the installed package)');
  const cuda = await cudaStatus();
  if (!cuda.available) return cannot('E_CUDA_UNAVAILABLE', `bench needs an NVIDIA GPU, and this machine has none usable: ${cuda.reason}`);
  const env = { ...process.env, VSNAP_BENCH_DROP_CACHES: ctx.options.dropCaches ? '1' : '0' };
  if (ctx.args[0] === 'swap') return spawnSync('bash', [script, ...ctx.args], { stdio: 'inherit', env }).status ?? EXIT.failed;
  if (ctx.args.length) throw new UsageError(`bench takes no argument but \`swap\` (got ${ctx.args.join(' ')})`);
  for (const [flag, v] of [['--gib', ctx.options.gib], ['--gpus', ctx.options.gpus]] as const) {
    if (!/^[1-9]\d*$/.test(v ?? '')) throw new UsageError(`${flag} must be a whole number >= 1`);
  }
  const out = ctx.options.out ? resolve(ctx.options.out) : mkdtempSync(join(tmpdir(), 'vsnap-bench-'));
  mkdirSync(out, { recursive: true });
  try {
    return spawnSync('bash', [script, ctx.options.gib!, out, ctx.options.gpus!], { stdio: 'inherit', env }).status ?? EXIT.failed;
  } finally {
    if (!ctx.options.out) rmSync(out, { recursive: true, force: true });
  }
}
