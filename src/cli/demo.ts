import { createCipheriv, createHash } from 'node:crypto';

import { cudaStatus, listDevices } from '../gpu/cuda.js';
import { abortError } from '../errors.js';
import { DeviceAllocation } from '../gpu/device-allocation.js';
import { HostRegion } from '../regions/host-region.js';
import type { RegionMemory } from '../regions/memory.js';
import { Snapshot } from '../snapshot/snapshot.js';
import { RegionStore } from '../store/region-store.js';
import { releaseIdleResources } from '../transfer/idle.js';
import type { Context } from './context.js';
import { defaultStoreRoot, EXIT, UsageError } from './context.js';
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

/** Lets signals (Ctrl-C) through between pieces, and stops when aborted. */
async function yieldTo(signal: AbortSignal | undefined, what: string): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
  if (signal?.aborted) throw abortError(signal, what);
}

/** Bytes done so far of a pass over every region, reported as a transfer's progress is. */
type Tick = (bytes: number) => void;

async function fill(region: DemoRegion, tick: Tick, signal?: AbortSignal): Promise<void> {
  for (let off = 0; off < region.size; off += PIECE) {
    await yieldTo(signal, 'filling the demo regions');
    const n = Math.min(PIECE, region.size - off);
    await region.write(off, patternBytes(region.key, off, n));
    tick(n);
  }
}

async function check(region: DemoRegion, tick: Tick, signal?: AbortSignal): Promise<boolean> {
  for (let off = 0; off < region.size; off += PIECE) {
    await yieldTo(signal, 'checking the restored bytes');
    const n = Math.min(PIECE, region.size - off);
    if (!(await region.read(off, n)).equals(patternBytes(region.key, off, n))) return false;
    tick(n);
  }
  return true;
}

/**
 * Runs `step` over every region under one progress line (`label`, e.g. `fill`): the pattern is
 * made on the CPU, so these passes take longer than the capture and restore they frame.
 */
async function pass<T>(label: string, regions: readonly DemoRegion[], step: (r: DemoRegion, tick: Tick) => Promise<T>): Promise<T[]> {
  const bar = progressLine(label);
  const total = regions.reduce((n, r) => n + r.size, 0);
  let done = 0;
  const tick: Tick = (n) => {
    done += n;
    bar.update({ phase: label, bytesDone: done, bytesTotal: total });
  };
  try {
    const out: T[] = [];
    for (const r of regions) out.push(await step(r, tick));
    return out;
  } finally {
    bar.done();
  }
}

/**
 * The demo's region sizes: weights-like shares of `total` (rounded down to the granule), each a
 * multiple of `granule`, the first taking what rounding left so they add up to `total` exactly.
 * @internal
 */
export function demoSizes(total: number, granule: number): number[] {
  // A weights-like mix: one big embedding, mid-size layers, a small norm-sized tail.
  const shares = [0.4, 0.2, 0.2, 0.15, 0.05];
  const whole = Math.max(shares.length, Math.floor(total / granule)) * granule;
  const sizes = shares.map((s) => Math.max(granule, Math.floor((whole * s) / granule) * granule));
  sizes[0]! += whole - sizes.reduce((a, b) => a + b, 0);
  return sizes;
}

/** What `vsnap demo` did (its `--json` output). */
export interface DemoReport {
  ok: boolean;
  device: 'gpu' | 'cpu';
  store: string;
  regions: number;
  capture: { id: string; bytes: number; seconds: number; dedupedBytes: number };
  restore: { bytes: number; seconds: number };
}

/** The demo's snapshot name, and the model id its captures record (so it never writes over a snapshot it did not make). */
const DEMO_NAME = 'demo';
const DEMO_MODEL = 'vsnap/demo-pattern';

/** vsnap demo [--size MiB] [--cpu] [--store dir]: into the same store as every other command (the default one unless --store). */
export async function demo(ctx: Context): Promise<number> {
  const totalMiB = Number(ctx.options.size ?? '1024');
  if (!Number.isInteger(totalMiB) || totalMiB < 1) throw new UsageError('--size must be a whole number of MiB >= 1');
  const report = await runDemo({
    totalMiB,
    cpu: ctx.options.cpu === true,
    signal: ctx.signal,
    store: ctx.storeRoot,
    named: ctx.options.store !== undefined,
    ...(ctx.json ? { log: () => undefined } : {}),
  });
  if (ctx.json) ctx.print('', report);
  return report.ok ? EXIT.ok : EXIT.failed;
}

/**
 * The demo behind `npm start`: makes a few regions of realistic sizes (on the GPU when there is
 * one, else host memory), fills them with a seeded pattern, captures them into a real store,
 * wipes them, restores, and checks every byte.
 */
export async function runDemo(options: { store?: string; named?: boolean; totalMiB?: number; cpu?: boolean; log?: (s: string) => void; signal?: AbortSignal }): Promise<DemoReport> {
  const log = options.log ?? ((s: string) => console.log(s));
  const signal = options.signal ? { signal: options.signal } : {};
  const status = await cudaStatus();
  const useGpu = !options.cpu && status.available && (await listDevices()).length > 0;
  const total = (options.totalMiB ?? 1024) * 1024 * 1024;
  const sizes = demoSizes(total, useGpu ? 2 * 1024 * 1024 : 4096);

  log(
    useGpu
      ? `vsnap demo on the GPU (${(await listDevices())[0]!.name}): ${sizes.length} regions, ${formatBytes(sizes.reduce((a, b) => a + b, 0))}`
      : `vsnap demo on the CPU (${status.available ? 'forced' : `no GPU: ${status.reason}`}): ${sizes.length} host-memory regions, ${formatBytes(sizes.reduce((a, b) => a + b, 0))}`,
  );

  const root = options.store ?? defaultStoreRoot();
  const store = await RegionStore.open(root);
  await refuseForeignDemo(store, root);
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
    log(`filling   ${regions.length} regions with a seeded pattern (made on the CPU: the slowest step here)`);
    await pass('fill', regions, (r, tick) => fill(r, tick, options.signal));

    log(`capturing ${formatBytes(sizes.reduce((a, b) => a + b, 0))} into ${root}`);
    const captureProgress = progressLine('capture');
    const snap = await Snapshot.capture(store, DEMO_NAME, {
      regions: regions.map((r) => ({ key: r.key, size: r.size, memory: r.memory })),
      model: { id: DEMO_MODEL },
      onProgress: captureProgress.update,
      ...signal,
    }).finally(() => captureProgress.done());
    const c = snap.lastCapture!;
    log(`captured  ${formatBytes(c.bytes)} in ${c.seconds.toFixed(3)} s (${formatRate(c.bytes, c.seconds)}), to ${root}` +
      (c.dedupedBytes ? ` (${formatBytes(c.dedupedBytes)} already stored: deduplicated)` : ''));

    await pass('wipe', regions, async (r, tick) => {
      await yieldTo(options.signal, 'wiping the demo regions');
      await r.wipe();
      tick(r.size);
    });
    log('wiped     every region');

    const restoreProgress = progressLine('restore');
    const restored = await (await Snapshot.open(store, DEMO_NAME)).restore({
      regions: regions.map((r) => ({ key: r.key, size: r.size, memory: r.memory })),
      onProgress: restoreProgress.update,
      ...signal,
    }).finally(() => restoreProgress.done());
    log(`restored  ${formatBytes(restored.bytes)} in ${restored.seconds.toFixed(3)} s (${formatRate(restored.bytes, restored.seconds)}), every chunk verified`);

    log('checking  every byte against the pattern');
    const ok = (await pass('check', regions, (r, tick) => check(r, tick, options.signal))).every(Boolean);
    log(ok ? 'checked   every byte: identical to what was captured' : 'MISMATCH: restored bytes differ from the captured ones');
    const where = options.named ? ` --store ${root}` : '';
    log(`store     ${root}, snapshot "${DEMO_NAME}" (list it with: npx vsnap ls${where}; remove it with: npx vsnap rm ${DEMO_NAME}${where})`);
    return {
      ok,
      device: useGpu ? 'gpu' : 'cpu',
      store: root,
      regions: sizes.length,
      capture: { id: snap.id, bytes: c.bytes, seconds: c.seconds, dedupedBytes: c.dedupedBytes ?? 0 },
      restore: { bytes: restored.bytes, seconds: restored.seconds },
    };
  } finally {
    for (const r of regions) r.close();
    await releaseIdleResources();
  }
}

/** The demo shares the user's store: a snapshot called "demo" that another model made is left alone. */
async function refuseForeignDemo(store: RegionStore, root: string): Promise<void> {
  if (!(await store.list()).some((s) => s.name === DEMO_NAME)) return;
  const model = (await store.get(DEMO_NAME)).data.model?.id;
  if (model !== DEMO_MODEL) {
    throw new UsageError(`${root} already has a snapshot "${DEMO_NAME}" of another model (${model ?? 'none recorded'}): the demo leaves it alone; pass --store <another directory>`);
  }
}
