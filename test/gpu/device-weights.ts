// The codec GPU suites' regions: buffers written into device allocations, the region list a capture
// or restore takes, and the checks a restore is judged by (wiped, bit-exact, untouched).
import { randomChunk, weights } from '../helpers/codec-data.js';
import { DeviceAllocation } from '../../src/plumbing.js';

const MiB = 1024 ** 2;

/** One region's bytes, and its tensor (a dtype hint for the codec) where it has one. */
export interface WeightsCase {
  readonly key: string;
  readonly bytes: Buffer;
  readonly tensor?: { readonly dtype: string; readonly elements: number };
}

/** `total` bytes of Gaussian BF16 in regions of `region` bytes (`bf16.<i>`), then 64 MiB of random bytes (`noise`, no tensor). */
export function bf16AndNoise(total: number, region: number): WeightsCase[] {
  const cases: WeightsCase[] = [];
  for (let i = 0; i * region < total; i++) {
    const size = Math.min(region, total - i * region);
    const bytes = Buffer.concat(Array.from({ length: size / (64 * MiB) }, (_, k) => weights('bf16', 'gaussian', 64 * MiB, 1 + i * 16 + k)));
    cases.push({ key: `bf16.${i}`, bytes, tensor: { dtype: 'torch.bfloat16', elements: bytes.length / 2 } });
  }
  cases.push({ key: 'noise', bytes: randomChunk(64 * MiB, 99) });
  return cases;
}

/** The cases written into device allocations on GPU 0, with the checks on them; `close()` frees the allocations. */
export async function onDevice(cases: readonly WeightsCase[]) {
  const allocs: DeviceAllocation[] = [];
  try {
    for (const c of cases) {
      const a = await DeviceAllocation.allocate(0, c.bytes.length);
      allocs.push(a);
      await a.write(0, c.bytes);
    }
  } catch (err) {
    for (const a of allocs) a.close();
    throw err;
  }
  const regions = allocs.map((a, i) => {
    const { key, bytes, tensor } = cases[i]!;
    return {
      key,
      size: bytes.length,
      memory: { kind: 'device' as const, allocation: a },
      tensors: tensor ? [{ name: key, offset: 0, dtype: tensor.dtype, shape: [tensor.elements] }] : [],
    };
  });
  return {
    allocs,
    regions,
    rawBytes: cases.reduce((n, c) => n + c.bytes.length, 0),
    async wipe(): Promise<void> {
      for (const a of allocs) await a.fill(0, a.size, 0);
    },
    /** Every region holds its case's bytes (an allocation's size is rounded up to the VMM granularity: only the case's bytes count). */
    async holdsContents(): Promise<boolean> {
      for (const [i, a] of allocs.entries()) if (!(await a.read(0, cases[i]!.bytes.length)).equals(cases[i]!.bytes)) return false;
      return true;
    },
    async allZero(): Promise<boolean> {
      for (const a of allocs) if ((await a.read(0, a.size)).some((b) => b !== 0)) return false;
      return true;
    },
    close(): void {
      for (const a of allocs) a.close();
    },
  };
}
