import { rmSync } from 'node:fs';

import { afterEach, describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { suspendEngine } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController, type RecoveredEvent, type SwapControllerOptions } from '../../src/swap/controller.js';
import { StatusBoard } from '../../src/serve/status/board.js';
import { askCapital, startEngine } from '../helpers/engine.js';
import { FaultyClient } from '../helpers/faults.js';
import { tempDir } from '../helpers/tmp.js';

const GB = 1e9;
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

/** One engine, asleep, whose snapshot lost a blob. */
async function setup(extra: Partial<SwapControllerOptions>) {
  const e = await startEngine({ model: 'm' });
  const client = new FaultyClient({ baseUrl: e.url, token: e.token });
  cleanup.push(() => e.stop(), () => client.close());
  const answer = (await askCapital(client, 8)).ids;
  const store = await RegionStore.open(tempDir());
  const { snapshot } = await suspendEngine(store, 'm', client, { captureIfNeeded: true });
  const [first] = [...snapshot.manifest.regions()];
  rmSync(store.blobPath(first!.region.blob));
  const controller = await SwapController.create({ store, engines: [{ name: 'm', client, memoryBytes: 10 * GB }], budgets: { 0: 15 * GB }, ...extra });
  cleanup.push(() => controller.close());
  const loads = async () => Number((await client.wire.collectiveRpc('ref_weight_loads'))![0]);
  return { client, store, snapshot, controller, answer, loads };
}

const metric = async (controller: SwapController, name: string) => (await controller.registry.getSingleMetric(name)!.get()).values;

describe('the SwapController recovers an engine whose snapshot cannot be used', () => {
  it('by default: the engine is reloaded and served, counted by reason, shown on the status page, and a new snapshot follows', async () => {
    const { client, store, snapshot, controller, answer, loads } = await setup({});
    const events: string[] = [];
    const recovered: RecoveredEvent[] = [];
    controller.on('recovered', (e) => recovered.push(e));
    const materialized = new Promise<{ snapshotId: string }>((resolve) => controller.on('materialized', resolve));
    controller.on('swap', (e: { action: string; tier?: string; recovered?: string }) => events.push(`${e.action} ${e.tier} ${e.recovered ?? ''}`.trim()));
    const before = await loads();
    const lease = await controller.acquire('m');
    expect((await askCapital(client, 8)).ids).toEqual(answer);
    lease.release();
    expect(await loads()).toBe(before + 1);
    expect(events).toEqual(['restore engine missing']);
    expect(recovered).toEqual([expect.objectContaining({ engine: 'm', reason: 'missing', code: 'E_BLOB_MISSING', expectedResponse: 'matched' })]);
    const ok = await metric(controller, 'vsnap_recoveries_total');
    expect(ok).toEqual([expect.objectContaining({ labels: { engine: 'm', reason: 'missing', result: 'ok' }, value: 1 })]);
    expect((await metric(controller, 'vsnap_recovery_seconds')).find((v) => (v as { metricName?: string }).metricName === 'vsnap_recovery_seconds_count')!.value).toBe(1);

    const { snapshotId } = await materialized;
    expect(snapshotId).not.toBe(snapshot.id);
    expect((await store.current('m'))!.id).toBe(snapshotId);
    const view = controller.states()[0]!;
    expect(view.recovery).toMatchObject({ reason: 'missing', code: 'E_BLOB_MISSING', snapshot: 'captured' });
    expect(view.snapshotProblem).toBeUndefined(); // the new capture replaced the damaged one
    const board = new StatusBoard({ controller, store });
    cleanup.push(() => board.close());
    expect((await board.snapshot()).engines[0]!.recovery).toMatchObject({ reason: 'missing', snapshot: 'captured' });

    // The next cycle restores from the new snapshot: no capture on suspend, no reload on restore.
    expect((await controller.suspend('m'))!.captured).toBe(false);
    await controller.restore('m');
    expect(await loads()).toBe(before + 1);
    expect(controller.states()[0]!.recovery).toBeUndefined();
    expect(events.at(-1)).toBe('restore store');
  });

  it("with recovery 'fail', the model stays unservable as before (E_NOT_RESTORABLE), nothing reloaded", async () => {
    const { controller, loads } = await setup({ recovery: 'fail' });
    const before = await loads();
    const err = (await controller.acquire('m').catch((x: unknown) => x)) as VsnapError;
    expect(err).toBeInstanceOf(VsnapError);
    expect(err.code).toBe('E_NOT_RESTORABLE');
    expect(await loads()).toBe(before);
    expect(await metric(controller, 'vsnap_recoveries_total')).toEqual([]);
  });
});
