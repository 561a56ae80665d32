import { afterEach, describe, expect, it } from 'vitest';

import { RegionStore } from '../../src/store/region-store.js';
import { SwapController } from '../../src/swap/controller.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

// SwapController.close(): it refuses new work at once and waits for the swap in flight; the
// engines are left consistent with what the controller says. The swap is held at a gate (the
// woken engine's KV-cache wake waits for it), so nothing here depends on timing.

const GB = 1e9;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

/** A promise and its resolve, plus one that resolves when the gate is reached. */
function gate() {
  let open!: () => void;
  let reached!: () => void;
  const opened = new Promise<void>((r) => (open = r));
  const hit = new Promise<void>((r) => (reached = r));
  return { open, opened, hit, reached };
}

/** Two engines, room for one: one awake, the other suspended (and captured) at start. */
async function pair() {
  const clients: FaultyClient[] = [];
  for (const seed of [1, 2]) {
    const engine = await startEngine({ seed, model: `m${seed}` });
    const client = new FaultyClient({ baseUrl: engine.url, token: engine.token });
    cleanup.push(() => engine.stop(), () => client.close());
    clients.push(client);
  }
  const store = await RegionStore.open(tempDir());
  const controller = await SwapController.create({ store, engines: clients.map((client, i) => ({ name: `m${i + 1}`, client, memoryBytes: 10 * GB })), budgets: { 0: 15 * GB } });
  cleanup.push(() => controller.close());
  const view = (n: string) => controller.states().find((s) => s.name === n)!;
  const [awake, asleep] = view('m1').state === 'awake' ? [0, 1] : [1, 0];
  return { controller, clients, view, awake: { name: `m${awake + 1}`, client: clients[awake]! }, asleep: { name: `m${asleep + 1}`, client: clients[asleep]! } };
}

describe('SwapController.close', () => {
  it('waits for the swap in flight, rejects the waiting requests and the queued work at once, and leaves the engines as the controller says', async () => {
    const { controller, view, awake, asleep } = await pair();
    const g = gate();
    asleep.client.inject({ route: 'wakeKv', pass: true, action: async () => (g.reached(), await g.opened) });
    const log: string[] = [];
    controller.on('swap', (e) => log.push(`${e.action} ${e.engine}`));
    const waiting = controller.acquire(asleep.name).catch((e: unknown) => e);
    await g.hit; // the swap runs: the woken engine waits at its KV-cache wake
    const queued = controller.suspend(asleep.name).catch((e: unknown) => e); // queued behind the swap

    const closing = controller.close();
    void closing.then(() => log.push('closed'));
    expect(await waiting).toMatchObject({ code: 'E_CLOSED' }); // refused at once, the swap still held
    await expect(controller.acquire(awake.name)).rejects.toMatchObject({ code: 'E_CLOSED' });
    await new Promise((r) => setImmediate(r));
    expect(log).not.toContain('closed');

    g.open();
    await closing;
    expect(await queued).toMatchObject({ code: 'E_CLOSED' }); // never started: no swap after close
    expect(log).toEqual([`suspend ${awake.name}`, `restore ${asleep.name}`, 'closed']); // the swap finished first
    expect(view(asleep.name).state).toBe('awake');
    expect(view(awake.name).state).toBe('asleep');
    expect(await asleep.client.wire.isSleeping()).toBe(false);
    expect(await awake.client.wire.isSleeping()).toBe(true);
    expect((await askCapital(asleep.client, 4)).ids).not.toBeNull(); // its weights are whole: it serves
    await expect(controller.resync(awake.name)).rejects.toMatchObject({ code: 'E_CLOSED' });
  });

  it('is idempotent: a second close (or the async dispose) is the same close', async () => {
    const { controller } = await pair();
    const first = controller.close();
    expect(first).toBeInstanceOf(Promise);
    expect(controller.close()).toBe(first);
    await first;
    await controller[Symbol.asyncDispose]();
    await expect(controller.restore('m1')).rejects.toMatchObject({ code: 'E_CLOSED' });
  });
});
