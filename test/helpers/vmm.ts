import { native, type NativeVmmTimings } from '../../src/native/index.js';

/** The VMM step totals (native/cuda/vmm_timing.h) between two readings, `now` by default read now. */
export function vmmSince(before: NativeVmmTimings, now: NativeVmmTimings = native().vmmTimings()): NativeVmmTimings {
  const out = {} as Record<string, { calls: number; items: number; seconds: number }>;
  for (const [k, v] of Object.entries(now)) {
    const b = before[k as keyof NativeVmmTimings];
    out[k] = { calls: v.calls - b.calls, items: v.items - b.items, seconds: v.seconds - b.seconds };
  }
  return out as NativeVmmTimings;
}
