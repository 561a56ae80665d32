import { afterEach, describe, expect, it } from 'vitest';

import { RegionStore } from '../../src/store/region-store.js';
import { SwapController, type SwapEvent } from '../../src/swap/controller.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const GB = 1e9;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function two() {
  const out: Array<{ client: FaultyClient; name: string; answer: number[] | null }> = [];
  for (const i of [1, 2]) {
    const e = await startEngine({ seed: i, model: `model-${i}` });
    const client = new FaultyClient({ baseUrl: e.url, token: e.token });
    cleanup.push(() => e.stop(), () => client.close());
    out.push({ client, name: `model-${i}`, answer: (await askCapital(client, 8)).ids });
  }
  return out;
}

// Two 10 GB engines (1 GB each asleep) on 19 GB: never both awake, but the weights of one (its
// snapshot's bytes, a few KB here) fit beside the other awake.
describe('SwapController: a suspend for another engine runs as one overlapped swap', () => {
  for (const overlap of [true, false]) {
    it(`overlap ${overlap}: ${overlap ? 'the restore starts before the suspend ends, its KV wake after it' : 'one step after the other'}; right answers; the budget holds in the accounting`, async () => {
      const [x, y] = await two();
      const store = await RegionStore.open(tempDir());
      const budget = 19 * GB;
      const controller = await SwapController.create({
        store,
        engines: [x!, y!].map((e) => ({ name: e.name, client: e.client, memoryBytes: 10 * GB, asleepBytes: 1 * GB })),
        budgets: { 0: budget },
        overlap,
      });
      cleanup.push(() => controller.close());
      const log: string[] = [];
      let worst = 0;
      controller.on('change', () => (worst = Math.max(worst, controller.usage()[0]!)));
      controller.on('swapStarted', (e: { engine: string; action: string }) => log.push(`start ${e.action} ${e.engine}`));
      const swaps: SwapEvent[] = [];
      controller.on('swap', (e: SwapEvent) => {
        swaps.push(e);
        log.push(`done ${e.action} ${e.engine}`);
      });
      for (const e of [x!, y!]) e.client.inject({ route: 'sleep', when: 'after', pass: true, action: () => log.push(`slept ${e.name}`), times: 10 });
      for (const e of [x!, y!]) e.client.inject({ route: 'wakeKv', when: 'before', pass: true, action: () => log.push(`wakeKv ${e.name}`), times: 10 });
      for (const round of [0, 1, 2]) {
        for (const e of [x!, y!]) {
          const lease = await controller.acquire(e.name);
          try {
            expect((await askCapital(lease.client, 8)).ids, `round ${round}`).toEqual(e.answer);
          } finally {
            lease.release();
          }
        }
      }
      expect(worst).toBeLessThanOrEqual(budget);
      const restores = swaps.filter((s) => s.action === 'restore');
      expect(restores.length).toBeGreaterThanOrEqual(5);
      // Each swap after the first: the suspend of one engine and the restore of the other.
      const i = log.lastIndexOf('start suspend model-1');
      const window = log.slice(i, i + 6);
      if (overlap) {
        expect(window.slice(0, 2)).toEqual(['start suspend model-1', 'start restore model-2']);
        expect(window.indexOf('slept model-1')).toBeLessThan(window.indexOf('wakeKv model-2'));
        expect(restores.every((s) => 'awaitRoom' in s.phases! || 'wakeKvCacheWait' in s.phases!)).toBe(true);
        // the suspended engine slept once the other's copy was over (its phases say how long it waited)
        expect(swaps.filter((s) => s.action === 'suspend').every((s) => 'awaitCopy' in s.phases!)).toBe(true);
      } else {
        expect(window.slice(0, 4)).toEqual(['start suspend model-1', 'slept model-1', 'done suspend model-1', 'start restore model-2']);
        expect(restores.every((s) => !('awaitRoom' in s.phases!))).toBe(true);
        expect(swaps.filter((s) => s.action === 'suspend').every((s) => s.phases !== undefined && !('awaitCopy' in s.phases))).toBe(true);
      }
    });
  }

  it('the suspend of the overlapped swap fails: the other engine is back asleep, its request told, the first engine still serves', async () => {
    const [x, y] = await two();
    const store = await RegionStore.open(tempDir());
    const controller = await SwapController.create({
      store,
      engines: [x!, y!].map((e) => ({ name: e.name, client: e.client, memoryBytes: 10 * GB, asleepBytes: 1 * GB })),
      budgets: { 0: 19 * GB },
    });
    cleanup.push(() => controller.close());
    controller.on('warning', () => undefined);
    controller.on('swapFailed', () => undefined);
    // one awake, one asleep after create: make sure which
    const lease = await controller.acquire('model-1');
    lease.release();
    let worst = 0;
    controller.on('change', () => (worst = Math.max(worst, controller.usage()[0]!)));
    const started: string[] = [];
    controller.on('swapStarted', (e: { engine: string; action: string }) => started.push(`${e.action} ${e.engine}`));
    x!.client.inject({ route: 'sleep' });
    const err = await controller.acquire('model-2').catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/'model-2' could not be given room: suspending 'model-1' failed/);
    expect(started.slice(0, 2)).toEqual(['suspend model-1', 'restore model-2']); // one overlapped swap
    expect(worst).toBeLessThanOrEqual(19 * GB);
    expect(await y!.client.wire.isSleeping()).toBe(true);
    const view = controller.states().find((e) => e.name === 'model-2')!;
    expect(view.state).toBe('asleep');
    const again = await controller.acquire('model-1');
    try {
      expect((await askCapital(again.client, 8)).ids).toEqual(x!.answer);
    } finally {
      again.release();
    }
  });
});
