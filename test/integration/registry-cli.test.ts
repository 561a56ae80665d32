import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { RegistryClient } from '../../src/registry/registry.js';
import { RegionStore } from '../../src/store/region-store.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { runCli } from '../helpers/cli.js';
import { patternedRegions } from '../helpers/regions.js';
import { registryAvailable, startRegistry } from '../helpers/registry.js';
import { tempDir } from '../helpers/tmp.js';

// `vsnap push` / `vsnap pull` (the built command), and a push SIGKILLed midway then resumed,
// against the real distribution registry on loopback (plain HTTP, anonymous).
const MiB = 1024 * 1024;
const run = registryAvailable();
const child = fileURLToPath(new URL('../fixtures/push-child.mjs', import.meta.url));

async function capture(root: string, name: string, sizes: Record<string, number>): Promise<RegionStore> {
  const store = await RegionStore.open(root);
  const regions = patternedRegions(sizes);
  try {
    await Snapshot.capture(store, name, { regions: [...regions].map(([key, r]) => ({ key, size: r.size, memory: r.memory })), chunkSize: 256 * 1024 });
  } finally {
    for (const r of regions.values()) r.close();
  }
  return store;
}

describe.skipIf(!run)('registry: the command line, and a killed push', () => {
  it('vsnap push and vsnap pull move a snapshot between stores; errors are clear', async () => {
    const dir = tempDir();
    const reg = await startRegistry(dir, {});
    try {
      await capture(join(dir, 's'), 'm', { a: 2 * MiB, b: MiB });
      const env = { XDG_CACHE_HOME: join(dir, 'cache'), DOCKER_CONFIG: join(dir, 'no-docker') };
      const ref = `${reg.prefix}/cli/m:v1`;
      const pushed = await runCli(['push', 'm', ref, '--store', join(dir, 's'), '--json'], env);
      expect(pushed.code, pushed.stderr).toBe(0);
      expect(JSON.parse(pushed.stdout)).toMatchObject({ layers: 2, bytesUploaded: 3 * MiB });
      const pulled = await runCli(['pull', ref, 'copy', '--store', join(dir, 'd'), '--json'], env);
      expect(pulled.code, pulled.stderr).toBe(0);
      expect(JSON.parse(pulled.stdout)).toMatchObject({ name: 'copy', bytesDownloaded: 3 * MiB });
      expect((await (await RegionStore.open(join(dir, 'd'))).verify('copy')).ok).toBe(true);
      const missing = await runCli(['pull', `${reg.prefix}/cli/none:v1`, '--store', join(dir, 'd')], env);
      expect(missing.code).toBe(1);
      expect(missing.stderr).toMatch(/E_SNAPSHOT_NOT_FOUND[^]*hint: check the repository and tag/);
      const badRef = await runCli(['push', 'm', 'not a ref', '--store', join(dir, 's')], env);
      expect(badRef.code).toBe(2); // bad usage
      expect(badRef.stderr).toMatch(/not a registry reference[^]*hint: see `vsnap push --help`/);
    } finally {
      await reg.close();
    }
  }, 60_000);

  it('a push killed midway (SIGKILL) resumes: only the bytes the registry lacks are sent', async () => {
    const dir = tempDir();
    const reg = await startRegistry(dir, {});
    try {
      const store = await capture(join(dir, 's'), 'k', { big: 4 * MiB });
      const ref = `${reg.prefix}/kill/k:v1`;
      const state = join(dir, 'state');
      const r = spawnSync(process.execPath, [child, join(dir, 's'), 'k', ref, state, String(MiB)], { encoding: 'utf8' });
      expect(r.signal, r.stderr).toBe('SIGKILL');
      const resumed = await new RegistryClient({ stateDir: state, chunkBytes: 256 * 1024, dockerConfig: false }).push(store, 'k', ref);
      expect(resumed.bytesResumed).toBe(MiB);
      expect(resumed.bytesUploaded).toBe(3 * MiB);
      const dst = await RegionStore.open(join(dir, 'd'));
      await new RegistryClient({ dockerConfig: false, stateDir: state }).pull(dst, ref);
      expect((await dst.verify('k')).ok).toBe(true);
    } finally {
      await reg.close();
    }
  }, 60_000);
});
