// kill -9 at random points of capture and of publish: after every kill the store holds the
// previous snapshot or the new one, byte-exact, never a torn one, and nothing is stranded.
import { spawn } from 'node:child_process';
import { createCipheriv, createHash } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { tempDir } from '../helpers/tmp.js';
import { bundle } from './bundle.js';
import { FULL, prng, record, SEED } from './figures.js';
import { usage } from './leaks.js';

let child = '';
beforeAll(async () => {
  child = await bundle('capture-child.ts');
});
const TRIALS = FULL ? 100 : 12;
const KiB = 1024;

function pattern(key: string, length: number): Buffer {
  const k = createHash('sha256').update(key).digest().subarray(0, 16);
  return createCipheriv('aes-128-ctr', k, Buffer.alloc(16)).update(Buffer.alloc(length));
}

interface Run {
  signal: NodeJS.Signals | null;
  code: number | null;
  output: string;
  /** ms from `started` to exit. */
  ms: number;
}

function runChild(root: string, seed: string, regionBytes: number, options: { at?: number; killAfterMs?: number; trace?: boolean } = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const env: NodeJS.ProcessEnv = { ...process.env };
    delete env.TEST_FAILPOINTS;
    if (options.at !== undefined) env.TEST_FAILPOINT_AT = String(options.at);
    if (options.trace) env.TEST_FAILPOINT_TRACE = '1';
    const p = spawn(process.execPath, [child, root, 'model', seed, String(regionBytes)], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    let started = 0;
    p.stdout.on('data', (d: Buffer) => {
      output += d.toString();
      if (!started && output.includes('started')) {
        started = performance.now();
        if (options.killAfterMs !== undefined) setTimeout(() => p.kill('SIGKILL'), options.killAfterMs);
      }
    });
    p.stderr.on('data', (d: Buffer) => (output += d.toString()));
    p.on('error', reject);
    p.on('exit', (code, signal) => resolve({ code, signal, output, ms: started ? performance.now() - started : 0 }));
  });
}

/**
 * Opens the store as a restarted process would, checks tmp/ was cleaned, and returns the seed the
 * current snapshot holds after verifying every chunk and comparing every byte. Throws if torn.
 */
async function currentSeed(root: string, candidates: string[], regionBytes: number): Promise<string> {
  const store = await RegionStore.open(root, { tmpGraceMs: 0 });
  expect(readdirSync(join(root, 'tmp'))).toEqual([]);
  const snap = await Snapshot.open(store, 'model');
  const report = await snap.verify();
  if (!report.ok) throw new Error(`torn: current ${snap.id} fails verification: ${JSON.stringify(report.problems)}`);
  const targets = [0, 1, 2].map((i) => ({ key: `layer.${i}`, size: regionBytes, region: HostRegion.create(regionBytes) }));
  try {
    await snap.restore({ regions: targets.map((t) => ({ key: t.key, size: t.size, memory: t.region.memory })) });
    for (const seed of candidates) {
      if (targets.every((t, i) => t.region.read(0, t.size).equals(pattern(`${seed}/${i}`, t.size)))) return seed;
    }
  } finally {
    for (const t of targets) t.region.close();
  }
  throw new Error(`torn: the current snapshot holds none of ${candidates.join(', ')}`);
}

/** Keeps only the current capture, then collects garbage: every blob left must be referenced. */
async function compact(root: string): Promise<void> {
  const store = await RegionStore.open(root);
  const current = await store.current('model');
  for (const m of await store.history('model')) {
    expect((await store.verify('model', { id: m.id })).ok).toBe(true); // non-current captures are whole too
    if (m.id !== current!.id) await store.remove('model', { id: m.id });
  }
  await store.gc();
  expect(await store.usage()).toMatchObject({ blobs: 3 });
}

interface Outcome {
  trials: number;
  killed: number;
  keptOld: number;
  tookNew: number;
  torn: number;
  points?: Record<string, number>;
}

async function trials(kind: 'publish' | 'capture', regionBytes: number): Promise<Outcome & { fdsBefore: number; fdsAfter: number; seconds: number }> {
  const random = prng(SEED + (kind === 'publish' ? 1 : 2));
  const root = tempDir();
  const started = performance.now();
  const first = await runChild(root, 'seed-0', regionBytes, { trace: kind === 'publish', at: kind === 'publish' ? 1e9 : undefined });
  expect(first.output).toMatch(/published/);
  // the failpoints one capture passes (capture.after-transfer, then every step of publish)
  const points = [...first.output.matchAll(/failpoint-reached \d+ (\S+)/g)].map((m) => m[1]!);
  if (kind === 'publish') expect(points.length).toBeGreaterThanOrEqual(8);
  // a capture's duration, to draw kill times from
  const timed = kind === 'capture' ? (await runChild(root, 'seed-0', regionBytes)).ms : 0;
  const fdsBefore = usage().fds;
  const out: Outcome = { trials: 0, killed: 0, keptOld: 0, tookNew: 0, torn: 0, ...(kind === 'publish' ? { points: {} } : {}) };
  let previous = 'seed-0';
  for (let t = 1; t <= TRIALS; t++) {
    const seed = `seed-${t}`;
    const run =
      kind === 'publish'
        ? await runChild(root, seed, regionBytes, { at: 1 + Math.floor(random() * points.length) })
        : await runChild(root, seed, regionBytes, { killAfterMs: random() * timed * 1.1 });
    out.trials++;
    const published = run.output.includes('published');
    if (run.signal === 'SIGKILL' && !published) out.killed++;
    const point = /failpoint (\S+)/.exec(run.output)?.[1];
    if (out.points && point) out.points[point] = (out.points[point] ?? 0) + 1;
    let holds: string;
    try {
      holds = await currentSeed(root, [previous, seed], regionBytes);
    } catch (err) {
      out.torn++;
      throw err;
    }
    if (published) expect(holds).toBe(seed);
    if (holds === seed) out.tookNew++;
    else out.keptOld++;
    previous = holds;
    if (t % 10 === 0 || t === TRIALS) await compact(root);
  }
  return { ...out, fdsBefore, fdsAfter: usage().fds, seconds: +((performance.now() - started) / 1000).toFixed(1) };
}

describe(`kill -9 at random points (seed ${SEED}, ${TRIALS} trials each)`, () => {
  const results: Record<string, unknown> = { seed: SEED };

  it('of publish (every failpoint from the end of the transfer to `current`): 0 torn', { timeout: 900_000 }, async () => {
    const r = await trials('publish', 64 * KiB);
    results.publish = r;
    record('kill', results);
    expect(r.torn).toBe(0);
    expect(r.killed).toBeGreaterThan(0);
    expect(r.fdsAfter).toBeLessThanOrEqual(r.fdsBefore);
  });

  it('of capture (at a random moment of the transfer): 0 torn', { timeout: 900_000 }, async () => {
    const r = await trials('capture', 2048 * KiB);
    results.capture = r;
    record('kill', results);
    expect(r.torn).toBe(0);
    expect(r.killed).toBeGreaterThan(0);
    expect(r.fdsAfter).toBeLessThanOrEqual(r.fdsBefore);
  });
});
