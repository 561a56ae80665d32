import { createServer, type AddressInfo } from 'node:net';

import { describe, expect, expectTypeOf, it } from 'vitest';

import { EngineClient } from '../../src/engine/engine-client.js';
import type { VsnapError } from '../../src/errors.js';
import { RegionStore } from '../../src/store/region-store.js';
import { SwapController, type EngineView, type SwapControllerOptions, type SwapEvent } from '../../src/swap/controller.js';
import { restoreOptions, suspendOptions } from '../../src/swap/flow-options.js';
import { resolveOptions } from '../../src/swap/options.js';
import type { Slot } from '../../src/swap/state.js';
import { tempDir } from '../helpers/tmp.js';

// The options are checked before any engine is asked anything: no engine runs here.

const GB = 1e9;
const client = new EngineClient({ baseUrl: 'http://127.0.0.1:9' });

async function refusal(extra: Record<string, unknown>, engine: Record<string, unknown> = {}): Promise<VsnapError> {
  const store = await RegionStore.open(tempDir());
  const options = { store, engines: [{ name: 'a', client, memoryBytes: GB, ...engine }], budgets: { 0: 2 * GB }, ...extra } as unknown as SwapControllerOptions;
  return SwapController.create(options).then(
    () => expect.unreachable('the options were accepted'),
    (e: VsnapError) => e,
  );
}

describe('SwapController options: unknown keys are refused with a hint', () => {
  it.each(['cache', 'resident', 'queueLimit', 'materialize', 'registry'])('%s (an option of 0.1 before they were grouped): refused, with the options there are', async (key) => {
    const e = await refusal({ [key]: {} });
    expect(e.code).toBe('E_INVALID_ARGUMENT');
    expect(e.message).toMatch(new RegExp(`^SwapController options has no option '${key}'[;:]`));
    expect(e.message).not.toMatch(/ now$/);
  });

  it('a typo, at every level: the option it is likely a typo of', async () => {
    expect((await refusal({ overlapp: false })).message).toMatch(/no option 'overlapp': did you mean 'overlap'\?/);
    expect((await refusal({ tiers: { rams: {} } })).message).toMatch(/options\.tiers has no option 'rams': did you mean 'ram'\?/);
    expect((await refusal({ tiers: { cache: {} } })).message).toMatch(/options\.tiers has no option 'cache'; the options are ram, gpu, neighbour, multipath/);
    expect((await refusal({ queue: { limits: 3 } })).message).toMatch(/options\.queue has no option 'limits': did you mean 'limit'\?/);
    expect((await refusal({ recovery: { policy: 'reload', materialise: 'off' } })).message).toMatch(/options\.recovery has no option 'materialise': did you mean 'materialize'\?/);
    expect((await refusal({ hooks: { checkpoint: {} } })).message).toMatch(/no option 'hooks'/); // test seams are no option
    expect((await refusal({ tiers: { neighbour: { device: 1, budgetByte: GB } } })).message).toMatch(/tiers\.neighbour has no option 'budgetByte': did you mean 'budgetBytes'\?/);
    expect((await refusal({}, { memoryByte: GB })).message).toMatch(/engine 'a' has no option 'memoryByte': did you mean 'memoryBytes'\?/);
    expect((await refusal({}, { deep: true })).message).toMatch(/engine 'a' has no option 'deep'/);
  });

  it('values are checked too: a recovery policy or materialize policy it does not know', async () => {
    expect(await refusal({ recovery: 'relaod' })).toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    expect(await refusal({ recovery: { policy: 'reload', materialize: 'later' } })).toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    expect(await refusal({ codec: 'zstd' })).toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/codec/) as string });
  });

  it("codec: the store codec of the captures it makes, passed to a suspend's capture-if-needed and to a recovery's materialize capture", async () => {
    const store = await RegionStore.open(tempDir());
    const engines = [{ name: 'a', client, memoryBytes: GB, check: { maxTokens: 2 } }];
    const slot = { spec: { ...engines[0]!, snapshot: 'a', devices: [0], asleepBytes: 0 }, devices: [0] } as unknown as Slot;
    const coded = resolveOptions({ store, engines, budgets: { 0: 2 * GB }, codec: 'vsnap-c1' });
    const step = { captureIfNeeded: true, onWarning: () => undefined };
    expect(suspendOptions(coded, slot, step).capture).toEqual({ check: { maxTokens: 2 }, codec: 'vsnap-c1' });
    expect(restoreOptions(coded, slot, { onWarning: () => undefined }).recovery).toEqual({ policy: 'reload', materialize: 'async', codec: 'vsnap-c1' });
    const raw = resolveOptions({ store, engines, budgets: { 0: 2 * GB } });
    expect(raw.codec).toBe('off');
    expect(suspendOptions(raw, slot, step).capture).toEqual({ check: { maxTokens: 2 } });
  });

  it('keys set to undefined are no keys (spread options stay easy)', async () => {
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const { port } = closed.address() as AddressInfo;
    await new Promise((r) => closed.close(r));
    const store = await RegionStore.open(tempDir());
    const nobody = new EngineClient({ baseUrl: `http://127.0.0.1:${port}`, retries: 0 });
    const options = { store, engines: [{ name: 'a', client: nobody, memoryBytes: GB, group: undefined }], budgets: { 0: 2 * GB }, queueLimit: undefined, tiers: { ram: undefined } };
    const c = await SwapController.create(options as SwapControllerOptions); // past the options: the engine that does not answer is failed
    expect(c.states()[0]).toMatchObject({ name: 'a', state: 'failed', devices: [0] });
    await c.close();
    await nobody.close();
  });
});

describe('SwapController events are typed', () => {
  it('each event has its payload type', () => {
    expectTypeOf<Parameters<SwapController['on']>>().not.toBeAny();
    const c = null as unknown as SwapController;
    const on = (): void => {
      c.on('swap', (e) => expectTypeOf(e).toEqualTypeOf<SwapEvent>());
      c.on('change', (views) => expectTypeOf(views).toEqualTypeOf<EngineView[]>());
      c.on('swapFailed', (e) => expectTypeOf(e.action).toEqualTypeOf<'suspend' | 'restore' | 'demote'>());
      c.on('recovered', (e) => expectTypeOf(e.reason).toEqualTypeOf<'missing' | 'damaged' | 'incompatible' | 'not-durable'>());
      // @ts-expect-error: no such event
      c.on('swapped', () => undefined);
      // @ts-expect-error: a swap event has no `bytes`
      c.on('swap', (e) => e.bytes);
    };
    expect(typeof on).toBe('function'); // type-checked by tsc (npm test), never run
  });
});
