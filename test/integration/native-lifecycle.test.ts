import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { cudaStatus } from '../../src/gpu/cuda.js';
import { packageRoot } from '../../src/native/index.js';
import { tempDir } from '../helpers/tmp.js';

const child = fileURLToPath(new URL('../fixtures/native-lifecycle.cjs', import.meta.url));
const prebuilt = join(packageRoot(), 'prebuilds', `linux-${process.arch}`);
const addon = join(prebuilt, readdirSync(prebuilt).find((f) => f.endsWith('.node'))!);

// Each stage of the addon's life, left in each way a process or a worker thread goes away:
// the environment's cleanup hook (workers), the atexit handler (process.exit) and plain
// finalisation (end) must leave no crash, no unhandled rejection and no socket file behind.
// With a CUDA driver, device memory and pinned host memory too (the GPU suite's machine).
const gpu = (await cudaStatus()).available;
const stages = ['loaded', 'pool', 'buffer', 'transfer', 'queue', 'listener', 'offer', 'peer', ...(gpu ? ['device', 'pinned'] : [])];
const hows = ['exit', 'worker', 'end'] as const;

describe('the addon ends cleanly at every lifecycle stage', () => {
  it.each(stages.flatMap((stage) => hows.map((how) => [stage, how] as const)))('%s, then %s', (stage, how) => {
    const dir = tempDir();
    const run = spawnSync(process.execPath, ['--unhandled-rejections=strict', child, addon, dir, stage, how], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(run.signal, run.stderr).toBeNull();
    expect(run.status, run.stderr).toBe(0);
    expect(run.stderr).toBe('');
    expect(run.stdout.trim()).toBe('done');
    expect(readdirSync(dir).filter((f) => f.endsWith('.sock')), 'socket files left behind').toEqual([]);
    expect(existsSync(dir)).toBe(true);
  });
});
