
import { afterEach, describe, expect, it } from 'vitest';

import { parseConfig } from '../../src/serve/config.js';
import { serve, type ServeHandle } from '../../src/serve/serve.js';
import { alive } from '../helpers/engine.js';
import { freePort, pausedReader } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

let handle: ServeHandle | undefined;
afterEach(async () => {
  await handle?.close();
  handle = undefined;
});


describe('vsnap serve with a client that stops reading', () => {
  it('close() (what SIGTERM runs) waits for it at most startup.graceSeconds, then stops everything; listening on every address without apiKey is warned of', async () => {
    const port = await freePort();
    const config = parseConfig(
      `listen: { host: 0.0.0.0, port: 0, responseStallSeconds: 600 }
store: ${tempDir()}
startup: { graceSeconds: 0.3 }
gpus: { "0": { budgetGiB: 1 } }
models:
  m1:
    command: node
    args: [examples/quickstart/reference-engine.mjs, --port, "\${PORT}", --seed, "1", --model, m1]
    port: ${port}
    token: engine-token-1
    memoryGiB: 0.6
`,
      'test.yaml',
    );
    const log: string[] = [];
    handle = await serve(config, { log: (l) => log.push(l), stateDir: tempDir() });
    expect(log.join('\n')).toMatch(/warning: listening on every address \(0\.0\.0\.0\) with no apiKey/);
    await handle.booted;
    const reader = await pausedReader(handle.agent.url, 'm1');
    expect(handle.controller.states().find((s) => s.name === 'm1')!.leases).toBe(1);
    const h = handle;
    handle = undefined;
    const pid = h.supervisor.pid('m1')!;
    await h.close(); // returns: the grace period ends and the reader's connection is closed
    expect(alive(pid)).toBe(false);
    reader.socket.resume();
    await reader.closed;
  });
});
