import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { EXPECTED_ABI } from '../../src/native/binding.js';
import { native, packageRoot } from '../../src/native/index.js';

// The linux-arm64 prebuild, loaded by an arm64 Node (Debian's, unpacked by .ci/arm64-node.sh)
// under qemu-user with PREBUILDS_ONLY=1, must give the same checksums as the x86 build here
// (its NEON code and the scalar code xxHash uses for short inputs) and run a real capture.
// CI (CI=true) installs both, so there the test must run; elsewhere it is skipped without them.
const root = process.env.VSNAP_ARM64_ROOT ?? '/tmp/vsnap-arm64-root';
const qemu = spawnSync('qemu-aarch64', ['--version']).status === 0;
const available = qemu && existsSync(join(root, 'usr', 'bin', 'node'));

const lengths = [0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 4096 + 7, (1 << 20) + 13];

const script = `
  const path = require('node-gyp-build').path(process.cwd());
  const b = require(path);
  const { pattern } = JSON.parse(process.argv[1]);
  const sums = pattern.lengths.map((n) => b.checksum(makePattern(n)));
  function makePattern(n) {
    const out = Buffer.alloc(n);
    for (let i = 0; i < n; i++) out[i] = (i * 31 + 7) & 0xff;
    return out;
  }
  (async () => {
    const pool = await b.createStagingPool(1 << 16, 4, -1);
    const fd = b.createMemfd('arm64', 1 << 20);
    require('node:fs').writeSync(fd, makePattern(1 << 20), 0, 1 << 20, 0);
    const blob = require('node:path').join(require('node:os').tmpdir(), 'vsnap-arm64-' + process.pid);
    const r = await b.startTransfer({ op: 'capture', label: 'arm64', pool, threads: 2,
      regions: [{ name: 'r', blobPath: blob, size: 1 << 20, chunkSize: 1 << 16, memory: { kind: 'host', fd } }] }).promise;
    require('node:fs').rmSync(blob);
    pool.close();
    console.log(JSON.stringify({ arch: process.arch, path, abi: b.abiVersion, impl: b.checksumImplementation, sums, capture: r.checksums[0] }));
  })();`;

function pattern(n: number): Buffer {
  const out = Buffer.alloc(n);
  for (let i = 0; i < n; i++) out[i] = (i * 31 + 7) & 0xff;
  return out;
}

describe('the linux-arm64 prebuild under qemu-user', () => {
  it.runIf(available || process.env.CI === 'true')('loads with PREBUILDS_ONLY and matches the x86 checksums and capture', async () => {
    expect(available, `qemu-aarch64 and an arm64 node in ${root} (bash .ci/arm64-node.sh)`).toBe(true);
    const out = execFileSync('qemu-aarch64', ['-L', root, join(root, 'usr', 'bin', 'node'), '-e', script, JSON.stringify({ pattern: { lengths } })], {
      cwd: packageRoot(),
      env: { ...process.env, PREBUILDS_ONLY: '1' },
      encoding: 'utf8',
      timeout: 180_000,
    });
    const got = JSON.parse(out) as { arch: string; path: string; abi: number; impl: string; sums: string[]; capture: string[] };
    expect(got.arch).toBe('arm64');
    expect(got.path).toContain('/prebuilds/linux-arm64/');
    expect(got.abi).toBe(EXPECTED_ABI);
    expect(got.impl).toBe('neon');
    expect(got.sums).toEqual(lengths.map((n) => native().checksum(pattern(n))));
    const chunks = Array.from({ length: 16 }, (_, i) => native().checksum(pattern(1 << 20).subarray(i << 16, (i + 1) << 16)));
    expect(got.capture).toEqual(chunks);
  });
});
