import { createCipheriv, createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cudaStatus, listDevices } from '../gpu/cuda.js';
import { DeviceAllocation } from '../gpu/device-allocation.js';
import { HostRegion } from '../regions/host-region.js';
import type { RegionMemory } from '../regions/memory.js';
import { Snapshot } from '../snapshot/snapshot.js';
import { RegionStore } from '../store/region-store.js';
import { releaseIdleResources } from '../transfer/staging.js';
import { formatBytes, formatRate, progressLine } from './output.js';

/** Deterministic pseudo-random bytes (AES-128-CTR keystream of a seed): fast and reproducible. */
export function patternBytes(seed: string, offset: number, length: number): Buffer {
  const key = createHash('sha256').update(seed).digest().subarray(0, 16);
  const block = Math.floor(offset / 16);
  const iv = Buffer.alloc(16);
  iv.writeBigUInt64BE(BigInt(block), 8);
  const cipher = createCipheriv('aes-128-ctr', key, iv);
  const skip = offset - block * 16;
  const out = cipher.update(Buffer.alloc(length + skip));
  return out.subarray(skip);
}

interface DemoRegion {
  key: string;
  size: number;
  memory: RegionMemory;
  write(offset: number, data: Buffer): Promise<void>;
  read(offset: number, length: number): Promise<Buffer>;
  wipe(): Promise<void>;
  close(): void;
}

const PIECE = 64 * 1024 * 1024;

async function fill(region: DemoRegion): Promise<void> {
  for (let off = 0; off < region.size; off += PIECE) {
    const n = Math.min(PIECE, region.size - off);
    await region.write(off, patternBytes(region.key, off, n));
  }
}

async function check(region: DemoRegion): Promise<boolean> {
  for (let off = 0; off < region.size; off += PIECE) {
    const n = Math.min(PIECE, region.size - off);
    if (!(await region.read(off, n)).equals(patternBytes(region.key, off, n))) return false;
  }
  return true;
}

/**
 * The demo behind `npm start`: makes a few regions of realistic sizes (on the GPU when there is
 * one, else host memory), fills them with a seeded pattern, captures them into a real store,
 * wipes them, restores, and checks every byte.
 */
export async function runDemo(options: { store?: string; totalMiB?: number; cpu?: boolean; log?: (s: string) => void }): Promise<boolean> {
  const log = options.log ?? ((s: string) => console.log(s));
  const status = await cudaStatus();
  const useGpu = !options.cpu && status.available && (await listDevices()).length > 0;
  const total = (options.totalMiB ?? 1024) * 1024 * 1024;
  // A weights-like mix: one big embedding, mid-size layers, a small norm-sized tail.
  const shares = [0.4, 0.2, 0.2, 0.15, 0.05];
  const granule = useGpu ? 2 * 1024 * 1024 : 4096;
  const sizes = shares.map((s) => Math.max(granule, Math.floor((total * s) / granule) * granule));

  log(
    useGpu
      ? `vsnap demo on the GPU (${(await listDevices())[0]!.name}): ${sizes.length} regions, ${formatBytes(sizes.reduce((a, b) => a + b, 0))}`
      : `vsnap demo on the CPU (${status.available ? 'forced' : `no GPU: ${status.reason}`}): ${sizes.length} host-memory regions, ${formatBytes(sizes.reduce((a, b) => a + b, 0))}`,
  );

  const regions: DemoRegion[] = [];
  try {
    for (const [i, size] of sizes.entries()) {
      const key = `model.layers.${i}.weight`;
      if (useGpu) {
        const alloc = await DeviceAllocation.allocate(0, size);
        regions.push({
          key, size, memory: { kind: 'device', allocation: alloc },
          write: (o, d) => alloc.write(o, d), read: (o, n) => alloc.read(o, n), wipe: () => alloc.fill(0, size, 0), close: () => alloc.close(),
        });
      } else {
        const host = HostRegion.create(size, key);
        regions.push({
          key, size, memory: host.memory,
          write: async (o, d) => host.write(o, d), read: async (o, n) => host.read(o, n),
          wipe: async () => { for (let o = 0; o < size; o += PIECE) host.write(o, Buffer.alloc(Math.min(PIECE, size - o))); },
          close: () => host.close(),
        });
      }
    }
    for (const r of regions) await fill(r);

    const root = options.store ?? join(tmpdir(), 'vsnap-demo-store');
    const store = await RegionStore.open(root);
    const captureProgress = progressLine('capture');
    const snap = await Snapshot.capture(store, 'demo', {
      regions: regions.map((r) => ({ key: r.key, size: r.size, memory: r.memory })),
      model: { id: 'vsnap/demo-pattern' },
      onProgress: captureProgress.update,
    });
    captureProgress.done();
    const c = snap.lastCapture!;
    log(`captured  ${formatBytes(c.bytes)} in ${c.seconds.toFixed(3)} s (${formatRate(c.bytes, c.seconds)}), to ${root}` +
      (c.dedupedBytes ? ` (${formatBytes(c.dedupedBytes)} already stored: deduplicated)` : ''));

    for (const r of regions) await r.wipe();
    log('wiped     every region');

    const restoreProgress = progressLine('restore');
    const restored = await (await Snapshot.open(store, 'demo')).restore({
      regions: regions.map((r) => ({ key: r.key, size: r.size, memory: r.memory })),
      onProgress: restoreProgress.update,
    });
    restoreProgress.done();
    log(`restored  ${formatBytes(restored.bytes)} in ${restored.seconds.toFixed(3)} s (${formatRate(restored.bytes, restored.seconds)}), every chunk verified`);

    let ok = true;
    for (const r of regions) ok = (await check(r)) && ok;
    log(ok ? 'checked   every byte: identical to what was captured' : 'MISMATCH: restored bytes differ from the captured ones');
    log(`store     ${root} (list it with: npx vsnap ls --store ${root})`);
    return ok;
  } finally {
    for (const r of regions) r.close();
    await releaseIdleResources();
  }
}
