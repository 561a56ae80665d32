import { execFileSync } from 'node:child_process';
import { constants } from 'node:os';

/**
 * How an engine is made to die with the process that started it: Linux's `PR_SET_PDEATHSIG`,
 * set in the child between fork and exec (Node's spawn cannot), by a program that sets it and
 * then execs the engine's command in the same process: util-linux's `setpriv --pdeathsig`
 * where it has it, else python3 (engines are Python) calling prctl through ctypes. The signal
 * comes when the thread that forked dies: Node spawns from its main thread, so when the
 * process dies (SIGKILL included). Undefined when neither program is there.
 * @internal
 */
export interface ParentDeathWrapper {
  /** What runs: `setpriv` or `python3`. */
  readonly program: string;
  /** Its arguments, the engine's command and arguments last. */
  args(signal: NodeJS.Signals, command: string, args: readonly string[]): string[];
}

// prctl(PR_SET_PDEATHSIG = 1, sig); then, if the parent already died (before prctl), exit; else exec.
const PYTHON = [
  'import ctypes, os, sys',
  'libc = ctypes.CDLL(None, use_errno=True)',
  'if libc.prctl(1, int(sys.argv[1]), 0, 0, 0) != 0: sys.exit("vsnap: prctl(PR_SET_PDEATHSIG) failed: errno %d" % ctypes.get_errno())',
  'if os.getppid() != int(sys.argv[2]): sys.exit(0)',
  'try: os.execvp(sys.argv[3], sys.argv[3:])',
  'except OSError as e: sys.exit("vsnap: cannot run %s: %s" % (sys.argv[3], e.strerror))',
].join('\n');

let found: ParentDeathWrapper | null | undefined;

/** The wrapper this machine has (looked up once), or undefined. */
export function parentDeathWrapper(): ParentDeathWrapper | undefined {
  if (found === undefined) found = lookUp();
  return found ?? undefined;
}

/** `setpriv --pdeathsig <sig> -- command args` (util-linux 2.33+). */
export const SETPRIV_WRAPPER: ParentDeathWrapper = { program: 'setpriv', args: (signal, command, args) => ['--pdeathsig', signal.replace(/^SIG/, ''), '--', command, ...args] };

/** `python3 -c <prctl, then execvp> <signal number> <this pid> command args`. */
export const PYTHON_WRAPPER: ParentDeathWrapper = {
  program: 'python3',
  args: (signal, command, args) => ['-c', PYTHON, String(constants.signals[signal]), String(process.pid), command, ...args],
};

function lookUp(): ParentDeathWrapper | null {
  try {
    const help = execFileSync('setpriv', ['--help'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 10_000 });
    if (help.includes('--pdeathsig')) return SETPRIV_WRAPPER;
  } catch {
    // no setpriv (or one without --pdeathsig): try python3
  }
  try {
    execFileSync('python3', ['-c', 'import ctypes; ctypes.CDLL(None).prctl'], { stdio: 'ignore', timeout: 10_000 });
    return PYTHON_WRAPPER;
  } catch {
    return null;
  }
}
