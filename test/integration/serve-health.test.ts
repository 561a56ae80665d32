import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';

import { parseConfig } from '../../src/serve/config.js';
import { serve, type ServeHandle } from '../../src/serve/serve.js';
import { freePort, probeUntil } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

let handle: ServeHandle | undefined;
afterEach(async () => {
  await handle?.close();
  handle = undefined;
});

describe('vsnap serve: health and the RAM tier at boot', () => {
  it('the boot-time captures land in the RAM tier; /healthz says degraded, naming the engine, while one is down, and ok once it is back', async () => {
    const [a, b] = [await freePort(), await freePort()];
    const engine = (port: number, seed: number) => `
    command: node
    args: [examples/quickstart/reference-engine.mjs, --port, "\${PORT}", --seed, "${seed}", --model, m${seed}]
    port: ${port}
    token: engine-token-${seed}
    memoryGiB: 0.6`;
    const config = parseConfig(
      `listen: { port: 0 }\nstore: ${tempDir()}\nramTierGiB: 0.05\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n  m1:${engine(a, 1)}\n  m2:${engine(b, 2)}\n`,
      'test.yaml',
    );
    handle = await serve(config, { log: () => undefined, stateDir: tempDir() });
    await handle.booted;
    const url = handle.agent.url;
    const status = (await (await request(`${url}/api/status`)).body.json()) as { ramTier: { entries: Array<{ name: string; durable: boolean }> } };
    expect(status.ramTier.entries.map((e) => e.name).sort()).toEqual(['m1', 'm2']);
    expect(status.ramTier.entries.every((e) => e.durable)).toBe(true);

    const health = async () => (await (await request(`${url}/healthz`)).body.json()) as { ok: boolean; status: string; degraded?: Array<{ engine: string; reason: string }> };
    expect(await health()).toMatchObject({ ok: true, status: 'ok' });
    process.kill(-handle.supervisor.pid('m2')!, 'SIGKILL'); // the engine's whole process group: it crashed
    const degraded = await probeUntil(async () => {
      const h = await health();
      return h.status === 'degraded' ? h : undefined;
    });
    expect(degraded).toMatchObject({ ok: false, degraded: [{ engine: 'm2', reason: expect.stringMatching(/process (restarting|starting)/) as string }] });
    await probeUntil(async () => ((await health()).status === 'ok' ? true : undefined));
  });
});
