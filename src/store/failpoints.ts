/**
 * Crash injection for the store's atomicity tests. `VSNAP_FAILPOINTS=publish.after-blobs`
 * (comma-separated names) makes the process SIGKILL itself when it reaches that point, exactly
 * like a crash there; `VSNAP_FAILPOINT_AT=<n>` kills it at the n-th point reached, whatever its
 * name (the reliability suite draws n at random; `VSNAP_FAILPOINT_TRACE=1` lists the points
 * reached). Unset in normal use: one environment lookup
 * per point.
 * @internal
 */
let reached = 0;

/** @internal */
export function failpoint(name: string): void {
  const spec = process.env.VSNAP_FAILPOINTS;
  if (spec && spec.split(',').includes(name)) process.kill(process.pid, 'SIGKILL');
  const at = process.env.VSNAP_FAILPOINT_AT;
  if (at !== undefined) {
    reached++;
    if (process.env.VSNAP_FAILPOINT_TRACE) process.stdout.write(`failpoint-reached ${reached} ${name}\n`);
    if (String(reached) === at) {
      process.stdout.write(`failpoint ${name}\n`);
      process.kill(process.pid, 'SIGKILL');
    }
  }
}
