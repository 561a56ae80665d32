import { describe, expect, it } from 'vitest';

import { RamTier } from '../../src/cache/ram-tier.js';
import { EngineClient } from '../../src/engine/engine-client.js';
import { EngineSession } from '../../src/flows/index.js';
import { RegionStore } from '../../src/store/region-store.js';
import { ask, useEngines } from '../helpers/engines.js';
import { tempDir } from '../helpers/tmp.js';

const { engine } = useEngines();
const MiB = 1024 * 1024;

describe('EngineSession: one engine with its store and tiers, each step one call (CPU reference engines)', () => {
  it('capture, suspend, restore, then swaps both ways: each engine answers as before, the tiers the sessions were opened with serve', async () => {
    const { client: a } = await engine({ seed: 1 });
    const { client: b } = await engine({ seed: 2 });
    const store = await RegionStore.open(tempDir());
    const cache = await RamTier.create({ budgetBytes: 64 * MiB, pin: false });
    try {
      const answerA = await ask(a);
      const answerB = await ask(b);
      expect(answerB).not.toEqual(answerA);
      const sa = await EngineSession.open({ client: a, store, name: 'a', tiers: { ram: cache } });
      const sb = await EngineSession.open({ client: b, store, name: 'b' });

      const snap = await sa.capture();
      expect((await store.current('a'))!.id).toBe(snap.id);
      const suspended = await sa.suspend();
      expect(suspended).toMatchObject({ captured: false, alreadyAsleep: false });
      expect(suspended.snapshot.id).toBe(snap.id);
      expect((await sa.status()).sleeping).toBe(true);
      const restored = await sa.restore();
      expect(restored.path).toBe('restored');
      expect(restored.tier).toBe('ram'); // the session's tier, not passed to the call
      expect(await ask(a)).toEqual(answerA);

      // b is captured by its own suspend, then a goes to sleep while b comes back, and back again.
      await sb.suspend({ captureIfNeeded: true });
      const there = await sa.swap(sb, { overlap: 'weights' });
      expect(there.suspend.snapshot.id).toBe(snap.id);
      expect(there.restore.tier).toBe('store'); // b's session has no tiers
      expect((await sa.status()).sleeping).toBe(true);
      expect(await ask(b)).toEqual(answerB);
      const back = await sb.swap(sa, { overlap: 'none' });
      expect(back.restore.tier).toBe('ram');
      expect((await sb.status()).sleeping).toBe(true);
      expect(await ask(a)).toEqual(answerA);
    } finally {
      cache.close();
    }
  });

  it('refuses what it does not know: unknown options, the engine tier, tiers on a step, an engine it cannot reach', async () => {
    const { client } = await engine();
    const store = await RegionStore.open(tempDir());
    await expect(EngineSession.open({ client, store, name: 'x', teirs: {} } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/did you mean 'tiers'/) });
    await expect(EngineSession.open({ client, store, name: 'x', tiers: { engine: true } } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', details: { name: 'tiers.engine' } });
    await expect(EngineSession.open({ client, store, name: 'x', tiers: { rma: undefined, ramm: {} } } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/did you mean 'ram'/) });
    const session = await EngineSession.open({ client, store, name: 'x' });
    await expect(session.restore({ tiers: {} } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(session.capture({ ram: undefined } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT' });
    await expect(session.suspend({ captureIfNeedd: true } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/did you mean 'captureIfNeeded'/) });
    await expect(session.swap(session, { overlp: 'none' } as never)).rejects.toMatchObject({ code: 'E_INVALID_ARGUMENT', message: expect.stringMatching(/did you mean 'overlap'/) });
    expect(client.calls.filter((r) => r !== 'status')).toEqual([]); // nothing refused reached the engine
    const gone = new EngineClient({ baseUrl: 'http://127.0.0.1:9', retries: 0 });
    try {
      await expect(EngineSession.open({ client: gone, store, name: 'x' })).rejects.toMatchObject({ code: 'E_ENGINE_UNREACHABLE' });
    } finally {
      await gone.close();
    }
  });
});
