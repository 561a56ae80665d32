import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { packageRoot } from '../../native/index.js';
import type { Context } from '../context.js';
import { EXIT } from '../context.js';

/** vsnap bench [GiB] [out-dir] [devices] | bench swap [-- options]: the benchmarks (a GPU machine, a source checkout). */
export async function bench(ctx: Context): Promise<number> {
  const script = join(packageRoot(), 'bench', 'run.sh');
  if (!existsSync(script)) {
    console.error('vsnap bench runs from a source checkout of vsnap (bench/run.sh), on a machine with an NVIDIA GPU and nvcc.');
    return EXIT.failed;
  }
  const r = spawnSync('bash', [script, ...ctx.args], { stdio: 'inherit' });
  return r.status ?? EXIT.failed;
}
