// GPU suite (device only): vLLM's own /sleep and /wake_up through the `vsnap` sleep-mode backend
// (--sleep-mode-backend vsnap) of the reference engine on CUDA: level 1 and 2 woken by tags, two
// engines of one model holding their weights once in one RAM tier, the RL loop (weights synced
// between sleeps come back, never an earlier sleep's), a tier entry changed behind the backend's
// back (the wake refused, the engine left asleep, a retry after the repair works), and the same
// cycle through cumem beside it, timed (logged, not asserted).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cudaStatus, EngineClient } from '../../src/index.js';
import { askCapital, pluginSitePath, startEngine, syncWeights, type TestEngine } from '../helpers/engine.js';
import { gpuMemoryOf } from './nvidia-smi.js';

const ARGS = ['--layers', '18', '--hidden', '2048'];
const ask = (c: EngineClient) => askCapital(c, 16);

function tier(dir: string, ...args: string[]): { used_bytes: number; entries: number; held: number } {
  const out = execFileSync('python3', ['-m', 'vsnap_vllm.ram_tier', ...args, dir], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: pluginSitePath() } });
  return JSON.parse(out) as { used_bytes: number; entries: number; held: number };
}

/** How many mappings of the tier's files a process holds (the worker keeps them from sleep to wake only). */
function tierMappings(pid: number, dir: string): number {
  return readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n').filter((l) => l.includes(dir)).length;
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

describe('GPU: --sleep-mode-backend vsnap', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  let dir: string;
  const started: Array<{ e: TestEngine; c: EngineClient }> = [];
  const start = async (backend: 'vsnap' | 'cumem', seed = 1) => {
    const e = await startEngine({ device: 'cuda', seed, model: `m${seed}`, args: [...ARGS, '--sleep-mode-backend', backend], env: { VSNAP_RAM_TIER: dir } });
    const x = { e, c: new EngineClient({ baseUrl: e.url, token: e.token }) };
    started.push(x);
    return x;
  };
  const stop = async (x: { e: TestEngine; c: EngineClient }) => {
    await x.c.close();
    await x.e.stop();
    started.splice(started.indexOf(x), 1);
  };

  before(() => {
    dir = mkdtempSync(join(existsSync('/dev/shm') ? '/dev/shm' : tmpdir(), 'vsnap-gpu-ram-tier-')); // tmpfs, as deployed
    tier(dir, 'init', '--budget', '64GiB');
  });
  after(async () => {
    for (const x of [...started]) await stop(x);
    rmSync(dir, { recursive: true, force: true });
  });

  it('level 1 and level 2 through /sleep and /wake_up, woken by tags, answers identical, no reload', async () => {
    const a = await start('vsnap');
    const expected = await ask(a.c);
    await assert.rejects(a.c.sleep({ level: 2 }), /level-2 sleep refused, nothing released/);
    await a.c.wakeUp();
    assert.deepEqual(await ask(a.c), expected);
    for (const level of [1, 2] as const) {
      await a.c.sleep({ level });
      assert.equal(await a.c.isSleeping(), true);
      await a.c.wakeUp({ tags: ['weights'] });
      await a.c.wakeUp({ tags: ['kv_cache'] });
      await a.c.resetPrefixCache();
      assert.deepEqual(await ask(a.c), expected, `level ${level}`);
    }
    assert.deepEqual(await a.c.collectiveRpc('ref_weight_loads'), ['1']);
    const replays = Number((await a.c.collectiveRpc('ref_graph_replays'))![0]);
    assert.ok(replays > 0, 'the answers came from the CUDA graphs captured before the sleeps');
    await stop(a);
  });

  it('two engines of one model hold their weights once in the tier', async () => {
    const a = await start('vsnap');
    const b = await start('vsnap');
    const expected = await ask(a.c);
    await a.c.sleep({ level: 1 });
    const one = tier(dir, 'status').used_bytes;
    await b.c.sleep({ level: 1 });
    assert.equal(tier(dir, 'status').used_bytes, one);
    for (const x of [b, a]) {
      await x.c.wakeUp();
      await x.c.resetPrefixCache();
      assert.deepEqual(await ask(x.c), expected);
    }
    await stop(a);
    await stop(b);
  });

  it('the RL loop: weights synced between level-1 sleeps come back, never the stale ones', async () => {
    const a = await start('vsnap');
    const original = await ask(a.c);
    await a.c.sleep({ level: 1 });
    await a.c.wakeUp();
    await syncWeights(a.e.url, 7);
    const synced = await ask(a.c);
    assert.notDeepEqual(synced, original);
    await a.c.sleep({ level: 1 });
    await a.c.wakeUp();
    await a.c.resetPrefixCache();
    assert.deepEqual(await ask(a.c), synced);
    await stop(a);
  });

  it('an entry changed behind its back: the wake refused, the engine asleep; repaired, the retry wakes it', async () => {
    const a = await start('vsnap', 3);
    const expected = await ask(a.c);
    const before = new Set(readdirSync(join(dir, 'entries')));
    await a.c.sleep({ level: 1 });
    const mine = readdirSync(join(dir, 'entries')).find((k) => !before.has(k)) ?? readdirSync(join(dir, 'entries'))[0]!;
    const fd = openSync(join(dir, 'entries', mine), 'r+');
    const byte = Buffer.alloc(1);
    readSync(fd, byte, 0, 1, 0);
    writeSync(fd, Buffer.from([byte[0]! ^ 0xff]), 0, 1, 0);
    const asleepMiB = gpuMemoryOf(a.e.enginePid);
    await assert.rejects(a.c.wakeUp({ tags: ['weights'] }), /do not match what was put to sleep/);
    assert.equal(await a.c.isSleeping(), true);
    // the weights memory the failed wake had mapped is released again (vLLM's allocator frees it)
    if (asleepMiB !== null) assert.ok(gpuMemoryOf(a.e.enginePid)! <= asleepMiB + 64, `GPU memory after the failed wake: ${gpuMemoryOf(a.e.enginePid)} MiB, asleep ${asleepMiB} MiB`);
    writeSync(fd, byte, 0, 1, 0);
    closeSync(fd);
    await a.c.wakeUp();
    await a.c.resetPrefixCache();
    assert.deepEqual(await ask(a.c), expected);
    assert.equal(tierMappings(a.e.enginePid, dir), 0, 'the tier entries are let go after the wake');
    await stop(a);
  });

  it('level-1 sleep and wake, vsnap against cumem (same run, logged)', async () => {
    const rows: string[] = [];
    for (const backend of ['cumem', 'vsnap'] as const) {
      const x = await start(backend, 5);
      const expected = await ask(x.c);
      const times: string[] = [];
      for (let i = 0; i < 3; i++) {
        const s = await timed(() => x.c.sleep({ level: 1 }));
        const w = await timed(() => x.c.wakeUp());
        times.push(`sleep ${s.toFixed(0)} ms, wake ${w.toFixed(0)} ms`);
      }
      await x.c.resetPrefixCache();
      assert.deepEqual(await ask(x.c), expected);
      rows.push(`${backend}: ${times.join('; ')}`);
      await stop(x);
    }
    console.log(`level-1 cycles (reference engine, ${ARGS.join(' ')}):\n  ${rows.join('\n  ')}`);
  });
});
