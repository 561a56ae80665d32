import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { VsnapError } from '../../src/errors.js';
import { cudaStatus, listDevices } from '../../src/gpu/cuda.js';
import { DeviceAllocation } from '../../src/gpu/device-allocation.js';
import { EXPECTED_ABI } from '../../src/native/binding.js';
import { diagnose, loadBinding, native, packageRoot } from '../../src/native/index.js';
import { patternBytes } from '../helpers/regions.js';
import { tempDir } from '../helpers/tmp.js';

const root = packageRoot();

describe('native addon loading', () => {
  it('the committed prebuild loads on its own (PREBUILDS_ONLY, no build/ directory used)', () => {
    const script = `
      const path = require('node-gyp-build').path(${JSON.stringify(root)});
      if (!path.includes('/prebuilds/linux-${process.arch}/')) throw new Error('resolved ' + path);
      const b = require(path);
      console.log(JSON.stringify({ path, abi: b.abiVersion, checksum: b.checksum(Buffer.from('abc')) }));`;
    const out = JSON.parse(
      execFileSync(process.execPath, ['-e', script], { cwd: root, env: { ...process.env, PREBUILDS_ONLY: '1' }, encoding: 'utf8' }),
    ) as { path: string; abi: number; checksum: string };
    expect(out.abi).toBe(EXPECTED_ABI);
    expect(out.checksum).toBe('06b05ab6733a618578af5f94892f3950');
    expect(readdirSync(join(root, 'prebuilds', `linux-${process.arch}`)).some((f) => f.endsWith('.node'))).toBe(true);
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
    expect(error!.message).toMatch(/What to do/);
    expect(error!.message).not.toMatch(/reinstall|npm install|npm rebuild/i);
    expect(error!.message).toMatch(/There is no prebuilt binary for linux-/);
    expect(error!.message).toMatch(/glibc \d+\.\d+/); // the libc it found
  });

  it('under --no-addons, says so and nothing else', () => {
    const run = spawnSync(process.execPath, ['--no-addons', '--import', 'tsx', '-e', loaderScript], { cwd: root, encoding: 'utf8' });
    const out = JSON.parse(run.stdout) as { code: string; message: string };
    expect(out.code).toBe('E_NATIVE_LOAD');
    expect(out.message).toMatch(/started with --no-addons/);
    expect(out.message).not.toMatch(/build it from source|reinstall/i);
  });

  it.each([
    ['a newer glibc', 'GLIBC_2.2.5\0', 'GLIBC_2.995\0', /needs GLIBC_2\.995, and this system has glibc 2\.\d+/],
    ['a libstdc++ symbol this system lacks', 'GLIBCXX_3.4.29\0', 'GLIBCXX_3.4.99\0', /libstdc\+\+ loaded here lacks GLIBCXX_3\.4\.99/],
  ])('a real binary that needs %s is refused by the dynamic loader, and the error says so', (_what, from, to, expected) => {
    const bytes = readFileSync(require_path());
    const at = bytes.indexOf(Buffer.from(from));
    expect(at).toBeGreaterThan(0);
    Buffer.from(to).copy(bytes, at);
    const patched = join(tempDir(), 'vsnap.node');
    writeFileSync(patched, bytes);
    let error: VsnapError | undefined;
    try {
      loadBinding(tempDir(), { VSNAP_NATIVE_PATH: patched });
    } catch (err) {
      error = err as VsnapError;
    }
    expect(error?.code).toBe('E_NATIVE_LOAD');
    expect(error!.message).toMatch(expected);
    expect(error!.message).not.toMatch(/reinstall|npm install|npm rebuild/i);
  });

  it('a prebuild that needs a newer glibc: names the version found and the one needed', () => {
    const attempts = [{ source: 'node-gyp-build', error: "/lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.39' not found (required by vsnap.node)" }];
    const advice = diagnose(attempts, root, { family: 'glibc', version: '2.31' }, []).join('\n');
    expect(advice).toMatch(/needs GLIBC_2\.39, and this system has glibc 2\.31/);
    expect(advice).not.toMatch(/reinstall|npm install/i);
  });

  it('a libstdc++ that lacks a symbol version: names it and the likely culprit', () => {
    const attempts = [{ source: 'node-gyp-build', error: "/opt/conda/lib/libstdc++.so.6: version `GLIBCXX_3.4.29' not found (required by vsnap.node)" }];
    const advice = diagnose(attempts, root, { family: 'glibc', version: '2.35' }, []).join('\n');
    expect(advice).toMatch(/lacks GLIBCXX_3\.4\.29 \(this system has glibc 2\.35\)/);
    expect(advice).toMatch(/LD_LIBRARY_PATH/);
  });

  it('musl: says the prebuilds are for glibc and what they need', () => {
    const attempts = [{ source: 'node-gyp-build', error: 'Error relocating vsnap.node: __libc_single_threaded: symbol not found' }];
    const advice = diagnose(attempts, root, { family: 'musl' }, []).join('\n');
    expect(advice).toMatch(/musl libc/);
    expect(advice).toMatch(/glibc \d+\.\d+ or newer/);
  });

  it('VSNAP_NATIVE_PATH takes precedence', () => {
    const path = require_path();
    const b = loadBinding(tempDir(), { VSNAP_NATIVE_PATH: path });
    expect(b.abiVersion).toBe(EXPECTED_ABI);
  });
});

const loaderScript = `import('./src/native/binding.ts').then((m) => m.loadBinding()).then(() => console.log('{}'), (e) => console.log(JSON.stringify({ code: e.code, message: e.message })))`;

function require_path(): string {
  const dir = join(root, 'prebuilds', `linux-${process.arch}`);
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
    expect(['avx512', 'avx2', 'sse2', 'neon', 'scalar']).toContain(native().checksumImplementation);
  });
});

describe('without a CUDA driver', async () => {
  const status = await cudaStatus();
  it.skipIf(status.available)('the module still loads and says why CUDA is unavailable', async () => {
    expect(status.available).toBe(false);
    expect(status.reason).toMatch(/libcuda/);
    await expect(listDevices()).rejects.toMatchObject({ code: 'E_CUDA_UNAVAILABLE' });
    // the error names the host-memory path a CPU-only program takes instead
    await expect(DeviceAllocation.allocate(0, 1 << 21)).rejects.toMatchObject({ code: 'E_CUDA_UNAVAILABLE', message: expect.stringMatching(/libcuda.*HostRegion\.create\(size\) from 'vsnap\/plumbing'/) as string });
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
