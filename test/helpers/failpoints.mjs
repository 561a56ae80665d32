// Test-only: makes the calling process stop at vsnap's failpoints (src/store/failpoints.ts) as a
// crash would, as its own environment (set by the test that spawns it) asks; or (holdAt) holds a
// flow of this process at a pause point while the test runs something beside it. The product never
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

/**
 * In this process: the first time pause point `name` is reached, the flow waits there until
 * release(); `reached` resolves as it arrives. remove() uninstalls the handler (release first).
 */
export function holdAt(name) {
  let arrive;
  const reached = new Promise((resolve) => (arrive = resolve));
  let release;
  const released = new Promise((resolve) => (release = resolve));
  let held = false;
  const handler = (point) => {
    if (point !== name || held) return undefined;
    held = true;
    arrive();
    return released;
  };
  globalThis[HANDLER] = handler;
  return {
    reached,
    release: () => release(),
    remove: () => {
      if (globalThis[HANDLER] === handler) delete globalThis[HANDLER];
    },
  };
}
