import { existsSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

import { parseConfig } from '../../src/serve/config.js';
import { serve } from '../../src/serve/serve.js';
import { freePort } from '../helpers/net.js';
import { tempDir } from '../helpers/tmp.js';

let holder: Server | undefined;
afterEach(async () => {
  await new Promise((r) => (holder ? holder.close(r) : r(undefined)));
  holder = undefined;
});

describe('vsnap serve: ports', () => {
  it('a listen port in use is refused with E_ADDRESS_IN_USE before any engine boots', async () => {
    const busy = await freePort();
    holder = createServer();
    await new Promise<void>((r) => holder!.listen(busy, '127.0.0.1', r));
    const dir = tempDir();
    const marker = join(dir, 'engine-started');
    const config = parseConfig(
      `listen: { host: 127.0.0.1, port: ${busy} }\nstore: ${join(dir, 'store')}\ngpus: { "0": { budgetGiB: 1 } }\nmodels:\n` +
        `  m1:\n    command: node\n    args: ["-e", "require('fs').writeFileSync(process.argv[1], 'x')", "${marker}"]\n    port: ${await freePort()}\n    memoryGiB: 0.5\n`,
      'test.yaml',
    );
    await expect(serve(config, { log: () => undefined, stateDir: tempDir() })).rejects.toMatchObject({ code: 'E_ADDRESS_IN_USE' });
    expect(existsSync(marker)).toBe(false);
  });
});
