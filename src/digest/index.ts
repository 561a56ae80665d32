import { toVsnapError } from '../errors.js';
import { native, type NativeHostBuffer } from '../native/index.js';
import { memoryDevice, toNativeMemory, type RegionMemory } from '../regions/memory.js';
import { deviceContexts } from '../transfer/contexts.js';

export { digestChunk, digestChunks } from './cpu.js';

/**
 * The per-chunk GPU digest recorded in manifests (schema version 2): `vsnap-gd1`, 128 bits,
 * computed by a kernel on the GPU for device memory and by the same code on the CPU for host
 * memory (native/digest/digest_mix.h). It detects changed weights and corrupt restores; the
 * stored bytes are guarded by XXH3-128.
 * @public
 */
export const DIGEST_ALGORITHM = 'vsnap-gd1';

/** Memory to digest: a region's memory, or a slice of the RAM tier. @internal */
export type DigestMemory = RegionMemory | { readonly kind: 'buffer'; readonly buffer: NativeHostBuffer; readonly offset: number };

/** @internal */
export interface DigestTarget {
  readonly size: number;
  readonly chunkSize: number;
  readonly memory: DigestMemory;
}

/** @internal */
export interface DigestResult {
  /** Per target, one digest per chunk. */
  readonly digests: string[][];
  /** Per target: `gpu` (the kernel) or `cpu`. */
  readonly backends: ReadonlyArray<'gpu' | 'cpu'>;
  /** Wall time of the whole call. */
  readonly seconds: number;
  /** Sum of the kernels' times (GPU targets). */
  readonly kernelSeconds: number;
  /** Per GPU (each digests its regions concurrently): bytes and the wall time of its batch. */
  readonly devices: ReadonlyArray<{ readonly device: number; readonly bytes: number; readonly seconds: number }>;
}

/**
 * Digests every chunk of every target, off the JS thread: device and imported memory with the
 * kernel on its GPU (imported memory is mapped for the call only), host memory on the CPU.
 * @internal
 */
export async function digestRegions(targets: readonly DigestTarget[]): Promise<DigestResult> {
  try {
    const devices = targets.map((t) => (t.memory.kind === 'buffer' ? undefined : memoryDevice(t.memory)));
    const r = await deviceContexts.use(devices, () =>
      native().digestRegions(
        targets.map((t) => ({ size: t.size, chunkSize: t.chunkSize, memory: t.memory.kind === 'buffer' ? t.memory : toNativeMemory(t.memory) })),
      ),
    );
    return {
      digests: r.digests,
      backends: r.backends,
      seconds: r.seconds,
      kernelSeconds: r.kernelMs.reduce((s, ms) => s + ms, 0) / 1000,
      devices: (r.devices ?? []).map((d) => ({ device: d.device, bytes: d.bytes, seconds: d.seconds })),
    };
  } catch (err) {
    throw toVsnapError(err);
  }
}

/** The indices of chunks whose digests differ (all of them when the counts differ). @internal */
export function changedChunks(expected: readonly string[], actual: readonly string[]): number[] {
  const n = Math.max(expected.length, actual.length);
  const out: number[] = [];
  for (let i = 0; i < n; i++) if (expected[i] !== actual[i]) out.push(i);
  return out;
}
