import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { startEngine } from '../helpers/engine.js';
import { runCli } from '../helpers/cli.js';
import { tempDir } from '../helpers/tmp.js';

// `vsnap restore --recover`: the CLI face of restoreEngine's recovery (needs `npm run build`).
describe('vsnap restore --recover', () => {
  it('fails without it when the snapshot is gone; with it the engine reloads, and --materialize async leaves a new snapshot', async () => {
    const engine = await startEngine();
    try {
      const store = ['--store', join(tempDir(), 's')];
      const env = { VSNAP_ENGINE_URL: engine.url, VSNAP_TOKEN: engine.token };
      expect((await runCli(['suspend', 'ref', ...store, '--capture'], env)).code).toBe(0);
      expect((await runCli(['rm', 'ref', ...store], env)).code).toBe(0);
      const refused = await runCli(['restore', 'ref', ...store], env);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/\[E_SNAPSHOT_NOT_FOUND\]/);
      const recovered = await runCli(['restore', 'ref', ...store, '--recover', '--materialize', 'async', '--json'], env);
      expect(recovered.code).toBe(0);
      const out = JSON.parse(recovered.stdout);
      expect(out).toMatchObject({ path: 'recovered', tier: 'engine', recovery: { reason: 'missing', code: 'E_SNAPSHOT_NOT_FOUND', materialized: true } });
      const ls = await runCli(['ls', ...store, '--json'], env);
      expect(JSON.stringify(JSON.parse(ls.stdout))).toContain(out.recovery.snapshot);
      expect((await runCli(['suspend', 'ref', ...store], env)).stdout).toMatch(/suspended in/);
      expect((await runCli(['restore', 'ref', ...store, '--recover'], env)).stdout).toMatch(/restored ref: .* from the store tier/);
    } finally {
      await engine.stop();
    }
  });
});
