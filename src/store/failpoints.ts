/**
 * Crash injection for the store's atomicity tests: `VSNAP_FAILPOINTS=publish.after-blobs`
 * (comma-separated names) makes the process SIGKILL itself when it reaches that point, exactly
 * like a crash there. Unset in normal use: one environment lookup per point.
 * @internal
 */
export function failpoint(name: string): void {
  const spec = process.env.VSNAP_FAILPOINTS;
  if (spec && spec.split(',').includes(name)) process.kill(process.pid, 'SIGKILL');
}
