import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { cudaStatus, listDevices } from '../../src/gpu/cuda.js';
import { DeviceAllocation } from '../../src/gpu/device-allocation.js';
import { loadBinding, native, packageRoot } from '../../src/native/index.js';
import { patternBytes } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const root = packageRoot();

describe('native addon loading', () => {
  it('the committed prebuild loads on its own (PREBUILDS_ONLY, no build/ directory used)', () => {
    const script = `
      const path = require('node-gyp-build').path(${JSON.stringify(root)});
      if (!path.includes('/prebuilds/linux-x64/')) throw new Error('resolved ' + path);
      const b = require(path);
      console.log(JSON.stringify({ path, abi: b.abiVersion, checksum: b.checksum(Buffer.from('abc')) }));`;
    const out = JSON.parse(
      execFileSync(process.execPath, ['-e', script], { cwd: root, env: { ...process.env, PREBUILDS_ONLY: '1' }, encoding: 'utf8' }),
    ) as { path: string; abi: number; checksum: string };
    expect(out.abi).toBe(3);
    expect(out.checksum).toBe('06b05ab6733a618578af5f94892f3950');
    expect(readdirSync(join(root, 'prebuilds', 'linux-x64')).some((f) => f.endsWith('.node'))).toBe(true);
  });

  it('fails with one error that lists every attempt and what to do', () => {
    const empty = tempDir();
    let error: VsnapError | undefined;
    try {
      loadBinding(empty, { VSNAP_NATIVE_PATH: join(empty, 'missing.node') });
    } catch (err) {
      error = err as VsnapError;
    }
    expect(error).toBeInstanceOf(VsnapError);
    expect(error!.code).toBe('E_NATIVE_LOAD');
    const attempts = error!.details.attempts as Array<{ source: string; error: string }>;
    expect(attempts.map((a) => a.source)).toEqual(['VSNAP_NATIVE_PATH', 'node-gyp-build']);
    expect(attempts[0]!.error).toMatch(/no file at/);
    expect(attempts[1]!.error).toMatch(/No native build was found/);
    expect(error!.message).toMatch(/Possible solutions/);
    expect(error!.message).toMatch(/npm rebuild vsnap/);
  });

  it('VSNAP_NATIVE_PATH takes precedence', () => {
    const path = require_path();
    const b = loadBinding(tempDir(), { VSNAP_NATIVE_PATH: path });
    expect(b.abiVersion).toBe(3);
  });
});

function require_path(): string {
  const dir = join(root, 'prebuilds', 'linux-x64');
  return join(dir, readdirSync(dir).find((f) => f.endsWith('.node'))!);
}

describe('checksums (xxh3-128)', () => {
  // Reference digests from the xxHash project's own `xxhsum -H2` over the same bytes.
  it.each([
    ['empty', Buffer.alloc(0), '99aa06d3014798d86001c324468d497f'],
    ['abc', Buffer.from('abc'), '06b05ab6733a618578af5f94892f3950'],
    ['200 pattern bytes', patternBytes('vector', 0, 200), 'c029cf5c0c4806020a792916bdeef26a'],
    ['10 bytes at offset 7', patternBytes('vector', 7, 10), '59010cfe2d198d3c12b12add8d7173ec'],
    ['1 MiB + 13', patternBytes('vector', 0, (1 << 20) + 13), 'ed0105e48c8e911edb53e29b24b87f62'],
  ])('%s', (_name, data, expected) => {
    expect(native().checksum(data)).toBe(expected);
  });

  it('reports the algorithm and the vector unit in use', () => {
    expect(native().checksumAlgorithm).toBe('xxh3-128');
    expect(['avx512', 'avx2', 'sse2']).toContain(native().checksumImplementation);
  });
});

describe('without a CUDA driver', async () => {
  const status = await cudaStatus();
  it.skipIf(status.available)('the module still loads and says why CUDA is unavailable', async () => {
    expect(status.available).toBe(false);
    expect(status.reason).toMatch(/libcuda/);
    await expect(listDevices()).rejects.toMatchObject({ code: 'E_CUDA_UNAVAILABLE' });
    await expect(DeviceAllocation.allocate(0, 1 << 21)).rejects.toMatchObject({ code: 'E_CUDA_UNAVAILABLE' });
  });

  it('a library that is not a driver is reported as such', () => {
    const out = execFileSync(
      process.execPath,
      ['-e', `require(${JSON.stringify(require_path())}).cudaStatus().then(s => console.log(JSON.stringify(s)))`],
      { env: { ...process.env, VSNAP_LIBCUDA: 'libc.so.6' }, encoding: 'utf8' },
    );
    const s = JSON.parse(out) as { available: boolean; reason: string };
    expect(s.available).toBe(false);
    expect(s.reason).toMatch(/cuGetProcAddress_v2/);
  });
});
