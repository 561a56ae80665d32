// What the benches share: units, the upper median, wall-clock seconds, GB/s and the page-cache drop.
// Pure but for the drop, so the report modules can import it without the addon.
import { execSync } from 'node:child_process';

export const MiB = 2 ** 20;
export const GiB = 2 ** 30;

/** The upper median: the middle value of an odd count, the upper of the middle two of an even one. */
export const median = (v: readonly number[]): number => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
/** Seconds since `t`, a `performance.now()`. */
export const since = (t: number): number => (performance.now() - t) / 1000;
export const gbps = (bytes: number, seconds: number): number => bytes / seconds / 1e9;

/** Drops the page cache (root only; not under `vsnap bench` without --drop-caches): null when it did, else why not. */
export function dropCaches(): string | null {
  if (process.env.VSNAP_BENCH_DROP_CACHES === '0') return 'VSNAP_BENCH_DROP_CACHES=0 (`vsnap bench` without --drop-caches)';
  try {
    execSync('sync; echo 3 > /proc/sys/vm/drop_caches', { stdio: ['ignore', 'ignore', 'pipe'], shell: '/bin/sh' });
    return null;
  } catch (err) {
    return `needs root and a writable /proc/sys: ${(err as { stderr?: Buffer }).stderr?.toString().trim() || (err as Error).message.split('\n')[0]!}`;
  }
}
