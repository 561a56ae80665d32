import { Command, CommanderError, Option } from 'commander';

import { toVsnapError, VsnapError } from '../errors.js';
import { VERSION } from '../version.js';
import { bench } from './commands/bench.js';
import { doctor } from './commands/doctor.js';
import { restore, snapshot, status, suspend } from './commands/engine.js';
import { serve, swap } from './commands/serve.js';
import { pull, push } from './commands/registry.js';
import { gc, ls, rm, verify } from './commands/store.js';
import { Context, EXIT, UsageError, type Options } from './context.js';
import { demo } from './demo.js';
import { cliHint, cliMessage } from './hints.js';

type Run = (ctx: Context) => Promise<number>;

const EPILOG = `
Exit codes: 0 ok; 1 failed (the error code, what happened and a hint are printed; with --json, as
{"code", "message", "hint"} on stdout); 2 bad usage; 3 verify found damage; 130 interrupted (Ctrl-C).
Ctrl-C stops a capture or restore and removes its temporary files; a second Ctrl-C exits at once.
Environment: VSNAP_STORE (the store), VSNAP_ENGINE_URL and VSNAP_TOKEN (an engine and its token),
VSNAP_AGENT_URL and VSNAP_CONTROL_TOKEN (a running vsnap serve and its control token),
VSNAP_REGISTRY_CA, VSNAP_REGISTRY_USERNAME and VSNAP_REGISTRY_PASSWORD (push and pull; else the
Docker config file, DOCKER_CONFIG or ~/.docker/config.json).`;

const opt = {
  json: () => new Option('--json', 'machine-readable output (errors too)'),
  store: () => new Option('--store <dir>', 'the store (default: $VSNAP_STORE, else $XDG_DATA_HOME/vsnap, else ~/.local/share/vsnap)'),
  engine: () => new Option('--engine <url>', 'an engine with the vsnap plugin (default: $VSNAP_ENGINE_URL)'),
  token: () => new Option('--token <token>', "the engine's VSNAP_TOKEN (default: $VSNAP_TOKEN)"),
  id: (what: string) => new Option('--id <id>', `a specific capture to ${what} (default: the current one)`),
};

/** The command line: one commander program, each command with only its own options. */
export function program(run: (command: string, fn: Run, args: string[], options: Options) => Promise<void>, json = false): Command {
  const p = new Command('vsnap')
    .description(`vsnap ${VERSION}: suspend and restore LLM inference engines on a GPU in well under a second`)
    .version(VERSION, '-v, --version')
    .addOption(opt.json())
    .showHelpAfterError('(add --help for usage)')
    .addHelpText('after', EPILOG)
    .exitOverride()
    .configureOutput({ writeErr: (s) => (json ? undefined : process.stderr.write(s)) }); // --json: the error goes to stdout as JSON
  const def = (name: string, description: string, fn: Run, ...options: Option[]): Command => {
    const c = p.command(name).description(description).exitOverride();
    for (const o of [...options, opt.json()]) c.addOption(o);
    c.action(async (...a: unknown[]) => {
      const cmd = a[a.length - 1] as Command;
      await run(cmd.name(), fn, cmd.args, cmd.optsWithGlobals<Options>());
    });
    return c;
  };
  def('demo', 'capture, wipe, restore and check a few regions (on the GPU if there is one, else host memory)', demo,
    new Option('--size <MiB>', 'bytes to move, in MiB').default('1024'), new Option('--cpu', 'host memory even when a GPU is present'),
    opt.store());
  def('doctor', 'check CUDA, the driver, the checkpoint API, devices, RAM, the store (read only) and, with --engine, an engine', doctor, opt.store(), opt.engine(), opt.token());
  def('snapshot', "capture a running engine's weights", snapshot, opt.engine(), opt.token(), opt.store(), new Option('--force', 'capture even if a snapshot exists'),
    new Option('--codec <codec>', 'how the store keeps the blobs: off (raw) or vsnap-c1 (coded on the CPU: fewer bytes on disk and over a registry)').choices(['off', 'vsnap-c1']).default('off')).argument('<name>', 'the snapshot name');
  def('suspend', 'sleep an engine, only if snapshot <name> can bring it back', suspend, opt.engine(), opt.token(), opt.store(), new Option('--capture', 'capture first when no snapshot matches'), new Option('--deep', "then checkpoint the engine's processes: 0 MiB left on the GPU (driver r570+)")).argument('<name>', 'the snapshot name');
  def('restore', "bring an engine's weights back from snapshot <name> and check its answer", restore, opt.engine(), opt.token(), opt.store(), opt.id('restore'),
    new Option('--recover', "when the snapshot cannot be used (missing, damaged, incompatible), have the engine reload its weights itself (vLLM's reload_weights)"),
    new Option('--materialize <when>', 'after a recovery, capture a new snapshot: off, async (after the engine is ready; waited for before exit) or required').choices(['off', 'async', 'required']).default('off'),
    new Option('--onto <gpu>', 'a deep-suspended engine: restore its process onto this GPU (ordinal or UUID, same kind; driver r580+)'))
    .argument('<name>', 'the snapshot name');
  def('status', 'an engine as its vsnap plugin sees it', status, opt.engine(), opt.token());
  def('serve', 'run engines, the swap controller, the OpenAI-compatible agent and its status page', serve, new Option('--config <file>', 'the configuration (YAML or JSON)').makeOptionMandatory());
  def('swap', 'wake a model through a running vsnap serve', swap,
    new Option('--agent <url>', 'the agent (default: $VSNAP_AGENT_URL, else http://127.0.0.1:8080)'),
    new Option('--token <token>', "the agent's control token (default: $VSNAP_CONTROL_TOKEN)")).argument('<model>', 'the model name');
  def('ls', 'list the snapshots in the store', ls, opt.store(), new Option('--all', 'every capture, with its id, size, date and whether it is durable'));
  def('verify', 're-hash every blob of a snapshot against its manifest (reads only)', verify, opt.store(), opt.id('verify')).argument('<name>', 'the snapshot name');
  def('rm', 'remove a snapshot (or one capture with --id) and free the blobs nothing else uses', rm, opt.store(), opt.id('remove')).argument('<name>', 'the snapshot name');
  def('gc', 'delete the blobs no snapshot references', gc, opt.store());
  const ca = (): Option => new Option('--ca <file>', "PEM of the registry's CA (default: $VSNAP_REGISTRY_CA; credentials: docker login, or $VSNAP_REGISTRY_USERNAME and $VSNAP_REGISTRY_PASSWORD)");
  def('push', 'send snapshot <name> to an OCI registry as <registry>/<repo>:<tag> (skips blobs it has, resumes)', push, opt.store(), opt.id('push'), ca())
    .argument('<name>', 'the snapshot name').argument('<reference>', '<registry>/<repo>:<tag> (http:// first for a plain-HTTP registry)');
  def('pull', 'fetch a snapshot from an OCI registry into the store (checked against --engine before any layer moves)', pull, opt.store(), opt.engine(), opt.token(), ca())
    .argument('<reference>', '<registry>/<repo>:<tag> or <registry>/<repo>@sha256:...').argument('[name]', 'the name in the store (default: the pushed name)');
  def('bench', 'the transfer benchmark with the ceiling and the peers, or `bench swap` (a source checkout, an NVIDIA GPU)', bench,
    new Option('--gib <n>', 'GiB to move').default('16'), new Option('--out <dir>', 'write the results (JSON and Markdown) there; without it they are only printed'),
    new Option('--gpus <n>', 'devices to spread the regions over').default('1'), new Option('--drop-caches', 'drop the page cache before cold reads (root)'))
    .argument('[swap...]', '`swap` and its options (bench/engine-swap.ts)');
  return p;
}

export async function main(argv: string[]): Promise<number> {
  const json = argv.includes('--json');
  const interrupt = new AbortController();
  let interrupts = 0;
  const onSigint = (): void => {
    if (++interrupts > 1) process.exit(EXIT.interrupted);
    if (!json) console.error('\nvsnap: interrupted: stopping and removing temporary files (Ctrl-C again to exit at once)');
    interrupt.abort(new VsnapError('E_ABORTED', 'interrupted (Ctrl-C)'));
  };
  process.on('SIGINT', onSigint);
  let code: number = EXIT.ok;
  let command = '';
  const prog = program(async (name, fn, args, options) => {
    command = name;
    code = await fn(new Context(name, args, options, interrupt.signal));
  }, json);
  try {
    await prog.parseAsync(argv, { from: 'user' });
    return code;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) return EXIT.ok; // --help, --version
      const first = argv.find((a) => !a.startsWith('-')) ?? '';
      const sub = prog.commands.some((c) => c.name() === first) ? first : '';
      if (json) printError({ code: 'E_USAGE', message: err.message.replace(/^error: /, ''), hint: cliHint('E_USAGE', sub) });
      return EXIT.usage;
    }
    return reportError(err, command, json, interrupt.signal.aborted);
  } finally {
    process.off('SIGINT', onSigint);
  }
}

function printError(e: { code: string; message: string; hint?: string | undefined }): void {
  console.log(JSON.stringify({ ok: false, code: e.code, message: e.message, ...(e.hint ? { hint: e.hint } : {}) }, null, 2));
}

function reportError(err: unknown, command: string, json: boolean, interrupted: boolean): number {
  if (err instanceof UsageError) {
    const hint = cliHint('E_USAGE', command);
    if (json) printError({ code: 'E_USAGE', message: err.message, hint });
    else console.error(`vsnap: ${err.message}\n${hint ? `hint: ${hint}` : ''}`);
    return EXIT.usage;
  }
  const e = toVsnapError(err);
  const message = cliMessage(e.message, command);
  const hint = cliHint(e.code, command, e.details);
  if (json) printError({ code: e.code, message, hint });
  else console.error(`vsnap: [${e.code}] ${message}${hint ? `\nhint: ${hint}` : ''}`);
  if (e.code === 'E_INVALID_NAME') return EXIT.usage;
  if (e.code === 'E_ABORTED' && interrupted) return EXIT.interrupted;
  return EXIT.failed;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    console.error(err);
    process.exitCode = EXIT.failed;
  },
);
