import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

import { afterEach, describe, expect, it, vi } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { agentUrl, engineToken, nativePath, registryCredentials, SETTINGS, stagingIdleMs, storeRoot } from '../../src/settings.js';
import { DeviceContexts } from '../../src/transfer/contexts.js';
import { runTransfer } from '../../src/transfer/transfer.js';
import { tempDir } from '../helpers/tmp.js';

// src/settings.ts: every VSNAP_* variable of the SDK and the CLI, read when used and checked there.

const saved = process.env.VSNAP_STAGING_IDLE_MS;
afterEach(() => {
  if (saved === undefined) delete process.env.VSNAP_STAGING_IDLE_MS;
  else process.env.VSNAP_STAGING_IDLE_MS = saved;
  vi.useRealTimers();
});

function configError(read: () => unknown): VsnapError {
  try {
    read();
  } catch (err) {
    expect(err).toBeInstanceOf(VsnapError);
    return err as VsnapError;
  }
  throw new Error('no error thrown');
}

describe('VSNAP_STAGING_IDLE_MS', () => {
  it('is 30 s unset or empty, and any whole number of ms a timer honours when set', () => {
    expect(stagingIdleMs({})).toBe(30_000);
    expect(stagingIdleMs({ VSNAP_STAGING_IDLE_MS: '' })).toBe(30_000);
    expect(stagingIdleMs({ VSNAP_STAGING_IDLE_MS: '0' })).toBe(0);
    expect(stagingIdleMs({ VSNAP_STAGING_IDLE_MS: '1500' })).toBe(1500);
    expect(stagingIdleMs({ VSNAP_STAGING_IDLE_MS: '2147483647' })).toBe(2_147_483_647);
  });

  it.each(['soon', '-1', '1.5', '1e3', ' 5', '0x10', '2147483648', 'NaN'])('%j is E_CONFIG naming the variable and what it accepts, not NaN', (value) => {
    const err = configError(() => stagingIdleMs({ VSNAP_STAGING_IDLE_MS: value }));
    expect(err.code).toBe('E_CONFIG');
    expect(err.message).toMatch(/^\$VSNAP_STAGING_IDLE_MS is .*: it accepts a whole number of milliseconds from 0 to 2147483647\. Fix it, or unset it for the default\.$/);
    expect(err.details).toMatchObject({ variable: 'VSNAP_STAGING_IDLE_MS', issues: [{ path: 'VSNAP_STAGING_IDLE_MS' }] });
  });

  it('is read when used, not at import: a value set after loading takes effect, a bad one fails before anything is kept', async () => {
    vi.useFakeTimers();
    const log: string[] = [];
    const contexts = new DeviceContexts({ keep: async (d) => void log.push(`keep ${d}`), release: async (d) => void log.push(`release ${d}`) });
    process.env.VSNAP_STAGING_IDLE_MS = 'soon';
    await expect(contexts.use([0], async () => 'ran')).rejects.toMatchObject({ code: 'E_CONFIG', details: { variable: 'VSNAP_STAGING_IDLE_MS' } });
    expect(log).toEqual([]);
    process.env.VSNAP_STAGING_IDLE_MS = '250';
    await contexts.use([0], async () => 'ran');
    await vi.advanceTimersByTimeAsync(249);
    expect(contexts.kept()).toEqual([0]);
    await vi.advanceTimersByTimeAsync(1);
    expect(log).toEqual(['keep 0', 'release 0']);
  });

  it('a transfer started with a bad value fails with E_CONFIG, before a byte moves', async () => {
    const source = HostRegion.create(4096);
    try {
      source.write(0, Buffer.alloc(4096, 7));
      process.env.VSNAP_STAGING_IDLE_MS = '30s';
      const blobPath = join(tempDir(), 'blob');
      const regions = [{ name: 'r', blobPath, size: 4096, chunkSize: 4096, memory: source.memory }];
      await expect(runTransfer({ op: 'capture', label: 'bad setting', regions })).rejects.toMatchObject({ code: 'E_CONFIG' });
      expect(existsSync(blobPath)).toBe(false);
      delete process.env.VSNAP_STAGING_IDLE_MS;
      await runTransfer({ op: 'capture', label: 'good setting', regions });
      expect(readFileSync(blobPath).equals(Buffer.alloc(4096, 7))).toBe(true);
    } finally {
      source.close();
    }
  });
});

describe('the other settings', () => {
  it('an empty value counts as unset', () => {
    expect(storeRoot({ VSNAP_STORE: '' })).toBeUndefined();
    expect(storeRoot({ VSNAP_STORE: '/srv/vsnap' })).toBe('/srv/vsnap');
    expect(engineToken({ VSNAP_TOKEN: '' })).toBeUndefined();
    expect(agentUrl({})).toBeUndefined();
    expect(nativePath({ VSNAP_NATIVE_PATH: '/opt/vsnap.node' })).toBe('/opt/vsnap.node');
  });

  it('registry credentials are used only when both the user name and the password are set', () => {
    expect(registryCredentials({ VSNAP_REGISTRY_USERNAME: 'bob', VSNAP_REGISTRY_PASSWORD: 'pw' })).toEqual({ username: 'bob', password: 'pw' });
    expect(registryCredentials({ VSNAP_REGISTRY_USERNAME: 'bob' })).toBeUndefined();
    expect(registryCredentials({ VSNAP_REGISTRY_PASSWORD: 'pw' })).toBeUndefined();
  });

  it('docs/configuration.md lists every setting with its default', () => {
    const doc = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8');
    for (const [name, info] of Object.entries(SETTINGS)) {
      const row = doc.split('\n').find((line) => line.startsWith(`| \`${name}\``));
      expect(row, `${name} has a row in docs/configuration.md`).toBeDefined();
      expect(row).toContain(info.default);
    }
  });
});
