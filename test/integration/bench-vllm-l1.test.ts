// The vllm-l1 row of `npm run bench -- swap` against the CPU reference engine the bench starts
// itself: vLLM's level-1 sleep and wake through the dev routes, the answer checked after every wake.
import { afterEach, describe, expect, it } from 'vitest';

import { askCapital, type ReferenceEngine, startEngine, vllmRoutes } from '../../bench/engine.js';
import { runVllmLevel1 } from '../../bench/swap-vllm.js';

const running: ReferenceEngine[] = [];
afterEach(async () => {
  for (const e of running.splice(0)) await e.stop();
});
const start = async (): Promise<ReferenceEngine> => {
  const e = await startEngine({ device: 'host', seed: 1, model: 'vsnap/reference-host-1', args: [], startTimeoutMs: 20_000 });
  running.push(e);
  return e;
};

describe("bench swap: vLLM's level-1 sleep of a reference engine", () => {
  it('sleeps and wakes the engine once per cycle, records each, and leaves it awake with the same answer', async () => {
    const e = await start();
    const answer = await askCapital(e.url, 8);
    expect(answer.ids?.length).toBe(8);
    const logs: string[] = [];
    const r = await runVllmLevel1(e.url, e.enginePid, 2, answer, () => askCapital(e.url, 8), (m) => logs.push(m));
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
    expect(await vllmRoutes(e.url).isSleeping()).toBe(false);
    expect(logs).toHaveLength(2);
  });

  it('is skipped, touching nothing, when the engine is already asleep', async () => {
    const e = await start();
    await vllmRoutes(e.url).sleep(1);
    const r = await runVllmLevel1(e.url, e.enginePid, 2, null, () => askCapital(e.url, 8), () => {});
    expect(r.skipped).toMatch(/asleep/);
    expect(r.cycles).toEqual([]);
    expect(await vllmRoutes(e.url).isSleeping()).toBe(true);
  });

  it('fails when the answer after a wake differs', async () => {
    const e = await start();
    await expect(runVllmLevel1(e.url, e.enginePid, 1, { ids: [1], logprobs: null }, () => askCapital(e.url, 8), () => {})).rejects.toThrow(/answers differently/);
  });
});
