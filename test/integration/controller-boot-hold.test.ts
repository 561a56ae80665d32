import { afterEach, describe, expect, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import { suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { startEngine } from '../helpers/engine.js';
import { tempDir } from '../helpers/tmp.js';

// While vsnap serve boots an engine (SwapControllerOptions.booting) the controller counts it
// awake and in use: nothing is woken beside it that does not fit, and it is never suspended or
// woken; once its boot hold is released, its real state is read and the rest goes on.

const GB = 1e9;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

describe('SwapController: engines held while vsnap serve boots them', () => {
  it('a model that does not fit beside a booting engine is not woken until the boot hold is released', async () => {
    const e = await startEngine({ seed: 1, model: 'a' });
    const a = new EngineClient({ baseUrl: e.url, token: e.token });
    const b = new EngineClient({ baseUrl: 'http://127.0.0.1:9' }); // not up yet: it is still being started
    cleanup.push(() => e.stop(), () => a.close(), () => b.close());
    const store = await RegionStore.open(tempDir());
    await suspendEngine(store, 'a', a, { captureIfNeeded: true });
    const controller = await SwapController.create({
      store,
      engines: [
        { name: 'a', client: a, memoryBytes: 10 * GB },
        { name: 'b', client: b, memoryBytes: 10 * GB },
      ],
      budgets: { 0: 15 * GB }, // one awake at a time
      booting: ['b'],
    });
    cleanup.push(() => controller.close());
    expect(controller.states().find((s) => s.name === 'b')).toMatchObject({ state: 'awake', leases: 0 });
    expect(controller.usage()[0]).toBe(10 * GB); // b's memory is taken while it boots
    const woken: string[] = [];
    controller.on('swapStarted', (ev: { engine: string }) => woken.push(ev.engine));
    // a cannot fit beside b: the request waits (here until its timeout), and a is never woken
    await expect(controller.acquire('a', { timeoutMs: 300 })).rejects.toMatchObject({ code: 'E_TIMEOUT' });
    expect(woken).toEqual([]);
    expect((await a.wire.vsnapStatus()).sleeping).toBe(true);
    // b's boot is over (here it never came up): its state is read, and a can be woken
    await controller.releaseBootHold('b');
    expect(controller.states().find((s) => s.name === 'b')!.state).toBe('failed');
    const lease = await controller.acquire('a');
    lease.release();
    expect(woken).toEqual(['a']);
    await controller.releaseBootHold('b'); // idempotent
  });
});
