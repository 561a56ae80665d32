import { execFileSync } from 'node:child_process';
import { closeSync, openSync, readdirSync, readFileSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { pluginSitePath, startEngine, syncWeights, type TestEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// vLLM's own /sleep and /wake_up through the `vsnap` sleep-mode backend (--sleep-mode-backend
// vsnap, VLLM_PLUGINS=vsnap) of the reference engine on host memory, driven by the SDK's
// EngineClient over real HTTP: the same cases as test/gpu/sleep-backend.gpu.test.ts.

function tier(dir: string, ...args: string[]): { used_bytes: number } {
  const out = execFileSync('python3', ['-m', 'vsnap_vllm.ram_tier', ...args, dir], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: pluginSitePath() } });
  return JSON.parse(out) as { used_bytes: number };
}

const running: Array<{ e: TestEngine; c: EngineClient }> = [];
afterEach(async () => {
  for (const x of running.splice(0)) {
    await x.c.close();
    await x.e.stop();
  }
});

async function start(dir: string | undefined, seed = 1) {
  const e = await startEngine({ seed, model: 'm', args: ['--sleep-mode-backend', 'vsnap'], env: dir ? { VSNAP_RAM_TIER: dir } : {} });
  const x = { e, c: new EngineClient({ baseUrl: e.url, token: e.token }) };
  running.push(x);
  return x;
}

async function answer(c: EngineClient): Promise<string> {
  return (await c.completions({ prompt: 'The capital of France is', max_tokens: 6 })).text;
}

/** How many mappings of the tier's files a process holds (the worker keeps them from sleep to wake only). */
function tierMappings(pid: number, dir: string): number {
  return readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n').filter((l) => l.includes(dir)).length;
}

function newTier(): string {
  const dir = tempDir();
  tier(dir, 'init', '--budget', '1GiB');
  return dir;
}

describe('--sleep-mode-backend vsnap', () => {
  it('level 2 is refused until the tier holds the weights; level 1 and 2 woken by tags, without a reload', async () => {
    const a = await start(newTier());
    const expected = await answer(a.c);
    await expect(a.c.wire.sleep({ level: 2 })).rejects.toThrow(/level-2 sleep refused, nothing released/);
    await a.c.wire.wakeUp();
    expect(await answer(a.c)).toBe(expected);
    for (const level of [1, 2] as const) {
      await a.c.wire.sleep({ level });
      expect(await a.c.wire.isSleeping()).toBe(true);
      await a.c.wire.wakeUp({ tags: ['weights'] });
      expect(await a.c.wire.isSleeping()).toBe(true);
      await a.c.wire.wakeUp({ tags: ['kv_cache'] });
      expect(await answer(a.c)).toBe(expected);
    }
    expect(await a.c.wire.collectiveRpc('ref_weight_loads')).toEqual(['1']);
  });

  it('two engines of one model hold their weights once', async () => {
    const dir = newTier();
    const a = await start(dir);
    const b = await start(dir);
    const expected = await answer(a.c);
    await a.c.wire.sleep({ level: 1 });
    const one = tier(dir, 'status').used_bytes;
    expect(one).toBeGreaterThan(0);
    await b.c.wire.sleep({ level: 1 });
    expect(tier(dir, 'status').used_bytes).toBe(one);
    for (const x of [b, a]) {
      await x.c.wire.wakeUp();
      expect(await answer(x.c)).toBe(expected);
    }
  });

  it('the RL loop: weights synced between level-1 sleeps come back, never the stale ones', async () => {
    const a = await start(newTier());
    const original = await answer(a.c);
    await a.c.wire.sleep({ level: 1 });
    await a.c.wire.wakeUp();
    await syncWeights(a.e.url, 7);
    const synced = await answer(a.c);
    expect(synced).not.toBe(original);
    await a.c.wire.sleep({ level: 1 });
    await a.c.wire.wakeUp();
    expect(await answer(a.c)).toBe(synced);
  });

  it('an entry changed behind its back: the wake refused, the engine asleep; repaired, the retry wakes it', async () => {
    const dir = newTier();
    const a = await start(dir);
    const expected = await answer(a.c);
    await a.c.wire.sleep({ level: 1 });
    const victim = join(dir, 'entries', readdirSync(join(dir, 'entries'))[0]!);
    const fd = openSync(victim, 'r+');
    const byte = Buffer.alloc(1);
    readSync(fd, byte, 0, 1, 0);
    writeSync(fd, Buffer.from([byte[0]! ^ 0xff]), 0, 1, 0);
    const held = tierMappings(a.e.enginePid, dir);
    expect(held).toBe(readdirSync(join(dir, 'entries')).length);
    await expect(a.c.wire.wakeUp({ tags: ['weights'] })).rejects.toThrow(/the engine stays asleep: retry the wake/);
    expect(await a.c.wire.isSleeping()).toBe(true);
    expect(tierMappings(a.e.enginePid, dir)).toBe(held); // kept for the retry
    writeSync(fd, byte, 0, 1, 0);
    closeSync(fd);
    await a.c.wire.wakeUp();
    expect(await answer(a.c)).toBe(expected);
    expect(tierMappings(a.e.enginePid, dir)).toBe(0);
    expect(readdirSync(join(dir, 'holds'))).toEqual([]);
  });

  it('without a RAM tier it sleeps as cumem and says so in one line', async () => {
    const a = await start(undefined);
    const expected = await answer(a.c);
    await a.c.wire.sleep({ level: 1 });
    await a.c.wire.wakeUp();
    expect(await answer(a.c)).toBe(expected);
    expect(a.e.stderr().match(/sleeping as vLLM's cumem backend/g)).toHaveLength(1);
  });
});
