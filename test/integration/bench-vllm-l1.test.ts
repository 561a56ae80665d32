// The vllm-l1 row of `npm run bench -- swap` against the CPU reference engine: vLLM's level-1
// sleep and wake through the dev routes, with the answer checked after every wake.
import { afterEach, describe, expect, it } from 'vitest';

import { runVllmLevel1 } from '../../bench/swap-vllm.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';

const running: Array<TestEngine | EngineClient> = [];
afterEach(async () => {
  for (const x of running.splice(0)) await (x instanceof EngineClient ? x.close() : x.stop());
});

describe('bench swap: vLLM level-1 row (CPU reference engine)', () => {
  it('sleeps and wakes the engine once per cycle, records each, and leaves it awake with the same answer', async () => {
    const e = await startEngine();
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    running.push(e, client);
    const answer = await askCapital(client, 8);
    const logs: string[] = [];
    const r = await runVllmLevel1(client, e.enginePid, 2, answer, () => askCapital(client, 8), (m) => logs.push(m));
    expect(r.skipped).toBeNull();
    expect(r.allocator).toMatch(/stand-in|VSNAP_VLLM_SRC/);
    expect(r.cycles.map((c) => c.index)).toEqual([0, 1]);
    for (const c of r.cycles) {
      expect(c.answerSame).toBe(true);
      expect(c.sleepSeconds).toBeGreaterThan(0);
      expect(c.wakeSeconds).toBeGreaterThan(0);
      expect(c.hostHeldBytes).not.toBeNull(); // /proc/meminfo is there
      expect(c.processDeltaBytes).toHaveProperty('VmRSS');
    }
    expect(r.summary?.firstSleepSeconds).toBe(r.cycles[0]!.sleepSeconds);
    expect(r.summary?.laterSleepMedianSeconds).toBe(r.cycles[1]!.sleepSeconds);
    expect(await client.isSleeping()).toBe(false);
    expect(logs).toHaveLength(2);
  });

  it('is skipped, touching nothing, when the engine is already asleep', async () => {
    const e = await startEngine();
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    running.push(e, client);
    await client.sleep({ level: 1 });
    const r = await runVllmLevel1(client, e.enginePid, 2, null, () => askCapital(client, 8), () => {});
    expect(r.skipped).toMatch(/asleep/);
    expect(r.cycles).toEqual([]);
    expect(await client.isSleeping()).toBe(true);
  });

  it('fails when the answer after a wake differs', async () => {
    const e = await startEngine();
    const client = new EngineClient({ baseUrl: e.url, token: e.token });
    running.push(e, client);
    await expect(runVllmLevel1(client, e.enginePid, 1, { ids: [1], logprobs: null }, () => askCapital(client, 8), () => {})).rejects.toThrow(/answers differently/);
  });
});
