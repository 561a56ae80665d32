import { spawn } from 'node:child_process';
import { createCipheriv, createHash } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterEach, describe, expect, it } from 'vitest';

import { HostRegion } from '../../src/regions/host-region.js';
import { Snapshot } from '../../src/snapshot/snapshot.js';
import { RegionStore } from '../../src/store/region-store.js';
import { tempDir } from '../helpers/tmp.js';

const child = fileURLToPath(new URL('../fixtures/capture-child.mjs', import.meta.url));
const MiB = 1024 * 1024;
const TOTAL_MIB = 48;
const opened: HostRegion[] = [];
afterEach(() => {
  for (const r of opened.splice(0)) r.close();
});

function pattern(key: string, length: number): Buffer {
  const k = createHash('sha256').update(key).digest().subarray(0, 16);
  return createCipheriv('aes-128-ctr', k, Buffer.alloc(16)).update(Buffer.alloc(length));
}

interface ChildResult {
  signal: NodeJS.Signals | null;
  code: number | null;
  output: string;
}

function runChild(root: string, seed: string, options: { failpoint?: string; killAfterMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<ChildResult> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env, ...options.env, ...(options.failpoint ? { TEST_FAILPOINTS: options.failpoint } : {}) };
    const p = spawn(process.execPath, [child, root, 'model', seed, String(TOTAL_MIB)], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    p.stdout.on('data', (d: Buffer) => {
      output += d.toString();
      if (options.killAfterMs !== undefined && output.includes('started')) {
        setTimeout(() => p.kill('SIGKILL'), options.killAfterMs);
      }
    });
    p.stderr.on('data', (d: Buffer) => (output += d.toString()));
    p.on('error', reject);
    p.on('exit', (code, signal) => resolve({ code, signal, output }));
  });
}

/** Which seed the store's current snapshot holds, after checking every byte against its manifest. */
async function currentSeed(root: string): Promise<string> {
  const store = await RegionStore.open(root, { tmpGraceMs: 0 });
  expect(readdirSync(join(root, 'tmp'))).toEqual([]);
  const snap = await Snapshot.open(store, 'model');
  expect((await snap.verify()).ok).toBe(true);
  const targets = [...snap.manifest.regions()].map(({ region }) => {
    const r = HostRegion.create(region.size);
    opened.push(r);
    return { key: region.key, size: region.size, memory: r.memory, region: r };
  });
  await snap.restore({ regions: targets });
  for (const seed of ['old', 'new']) {
    if (targets.every((t, i) => t.region.read(0, t.size).equals(pattern(`${seed}/${i}`, t.size)))) return seed;
  }
  throw new Error('the current snapshot holds neither the old nor the new capture: torn');
}

describe('a capture killed with SIGKILL leaves the old snapshot or the new one, never a torn one', () => {
  async function withOld(): Promise<string> {
    const root = tempDir();
    const done = await runChild(root, 'old');
    expect(done.output).toMatch(/published/);
    return root;
  }

  it.each(['capture.after-transfer', 'publish.after-blobs', 'publish.after-manifest'])('killed at %s', async (failpoint) => {
    const root = await withOld();
    const killed = await runChild(root, 'new', { failpoint });
    expect(killed.signal).toBe('SIGKILL');
    expect(killed.output).not.toMatch(/published/);
    expect(await currentSeed(root)).toBe('old');
    const store = await RegionStore.open(root);
    const history = await store.history('model');
    if (failpoint === 'publish.after-manifest') {
      // complete, durable, just not current yet
      expect(history).toHaveLength(2);
      expect((await store.verify('model', { id: history[1]!.id })).ok).toBe(true);
    } else {
      expect(history).toHaveLength(1);
      const gc = await store.gc();
      expect(gc.blobsRemoved).toBe(failpoint === 'publish.after-blobs' ? 3 : 0);
    }
  });

  it('the product stops at no failpoint its environment names: only a handler the test installs in the process does', async () => {
    const root = await withOld();
    const env = { VSNAP_FAILPOINTS: 'capture.after-transfer,publish.after-blobs', VSNAP_FAILPOINT_AT: '1', VSNAP_FAILPOINT_TRACE: '1' };
    const run = await runChild(root, 'new', { env });
    expect(run.signal).toBeNull();
    expect(run.output).toMatch(/published/);
    expect(run.output).not.toMatch(/failpoint/);
    expect(await currentSeed(root)).toBe('new');
  });

  it('killed at random moments', async () => {
    const root = await withOld();
    const seen = new Set<string>();
    for (const delay of [0, 5, 20, 60, 120, 250, 500]) {
      const run = await runChild(root, 'new', { killAfterMs: delay });
      const seed = await currentSeed(root);
      if (run.output.includes('published')) expect(seed).toBe('new');
      seen.add(seed);
      if (seed === 'new') {
        // start over from the old state for the next trial
        const store = await RegionStore.open(root);
        await store.remove('model', { id: (await store.current('model'))!.id });
      }
    }
    expect(seen.has('old')).toBe(true);
  });
});
