// Test-only: makes the calling process stop at vsnap's failpoints (src/store/failpoints.ts) as a
// crash would, as its own environment (set by the test that spawns it) asks. The product never
// reads these variables; a child process of the crash tests calls installFailpoints(process.env).
//   TEST_FAILPOINTS=a,b      SIGKILL at the first point named a or b
//   TEST_FAILPOINT_AT=n      SIGKILL at the n-th point reached, whatever its name, after printing `failpoint <name>`
//   TEST_FAILPOINT_TRACE=1   with TEST_FAILPOINT_AT: print `failpoint-reached <i> <name>` at each point

// the key src/store/failpoints.ts keeps its handler under (a registered symbol: one per process)
const HANDLER = Symbol.for('vsnap.failpointHandler.v1');

/**
 * Installs the handler `env` asks for (none when it asks for nothing); `kill` and `write` are the
 * process's own unless a test of this module passes its recorders. Returns whether one was installed.
 */
export function installFailpoints(env, { kill = () => process.kill(process.pid, 'SIGKILL'), write = (line) => process.stdout.write(line) } = {}) {
  const named = env.TEST_FAILPOINTS ? env.TEST_FAILPOINTS.split(',') : [];
  const at = env.TEST_FAILPOINT_AT === undefined ? undefined : Number(env.TEST_FAILPOINT_AT);
  if (at !== undefined && !Number.isInteger(at)) throw new Error(`TEST_FAILPOINT_AT=${env.TEST_FAILPOINT_AT}: expected a whole number`);
  const trace = Boolean(env.TEST_FAILPOINT_TRACE);
  if (!named.length && at === undefined) return false;
  let reached = 0;
  globalThis[HANDLER] = (name) => {
    if (named.includes(name)) kill();
    if (at === undefined) return;
    reached++;
    if (trace) write(`failpoint-reached ${reached} ${name}\n`);
    if (reached === at) {
      write(`failpoint ${name}\n`);
      kill();
    }
  };
  return true;
}
