import { parseArgs } from 'node:util';

import { VsnapError } from '../errors.js';
import { VERSION } from '../version.js';
import { bench } from './commands/bench.js';
import { doctor } from './commands/doctor.js';
import { restore, snapshot, status, suspend } from './commands/engine.js';
import { serve, swap } from './commands/serve.js';
import { gc, ls, rm, verify } from './commands/store.js';
import { Context, EXIT, UsageError } from './context.js';
import { runDemo } from './demo.js';

const HELP = `vsnap ${VERSION}: suspend and restore LLM inference engines on a GPU in well under a second

Usage: vsnap <command> [options]

Commands:
  demo                      capture, wipe, restore and check a few regions (GPU if present, else host memory)
  doctor                    CUDA, driver, checkpoint API, devices, RAM, the store (and --engine, if given)
  snapshot <name>           capture a running engine's weights (--engine; --force to capture again)
  suspend <name>            sleep an engine, only if snapshot <name> can bring it back (--capture to make one)
  restore <name>            bring an engine's weights back and check its answer (--engine)
  status                    an engine's state as its vsnap plugin sees it (--engine)
  serve                     run engines, the swap controller and the OpenAI-compatible agent (--config)
  swap <model>              wake a model through a running agent (--agent, --token)
  ls                        list snapshots in the store
  verify <name>             re-hash every blob of a snapshot against its manifest
  rm <name>                 remove a snapshot (or one capture with --id) and free unreferenced blobs
  gc                        delete blobs no snapshot references
  bench [GiB] [dir] [gpus]  the transfer benchmark with the ceiling and the peers (source checkout, NVIDIA GPU)
  bench swap [-- options]   end-to-end swaps of two reference engines (options: bench/engine-swap.ts)

Options:
  --store <dir>             the store (default: $VSNAP_STORE, else $XDG_DATA_HOME/vsnap, else ~/.local/share/vsnap)
  --engine <url>            an engine with the vsnap plugin (default: $VSNAP_ENGINE_URL)
  --token <token>           the engine's VSNAP_TOKEN, or the agent's control token (default: $VSNAP_TOKEN)
  --agent <url>             a running vsnap serve (default: $VSNAP_AGENT_URL, else http://127.0.0.1:8080)
  --config <file>           serve: the configuration (YAML or JSON)
  --id <id>                 a specific capture of a snapshot (verify, rm, restore)
  --force                   snapshot: capture even if one exists
  --capture                 suspend: capture first when no snapshot matches
  --json                    machine-readable output
  --size <MiB>              demo: bytes to move (default 1024)
  --cpu                     demo: host memory even when a GPU is present
  -h, --help                this text
  -v, --version             the version

Exit codes: 0 ok; 1 failed (the error code and what to do are printed); 2 bad usage;
3 verification found damage.`;

type Command = (ctx: Context) => Promise<number>;

const COMMANDS: Record<string, Command> = {
  demo: async (ctx) => {
    const totalMiB = ctx.options.size === undefined ? 1024 : Number(ctx.options.size);
    if (!Number.isInteger(totalMiB) || totalMiB < 1) throw new UsageError('--size must be a whole number of MiB >= 1');
    const ok = await runDemo({ totalMiB, cpu: ctx.options.cpu, ...(ctx.options.store ? { store: ctx.options.store } : {}) });
    return ok ? EXIT.ok : EXIT.verifyFailed;
  },
  doctor,
  snapshot,
  suspend,
  restore,
  status,
  serve,
  swap,
  ls,
  verify,
  rm,
  gc,
  bench,
};

async function main(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        store: { type: 'string' },
        id: { type: 'string' },
        json: { type: 'boolean', default: false },
        size: { type: 'string' },
        cpu: { type: 'boolean', default: false },
        engine: { type: 'string' },
        token: { type: 'string' },
        agent: { type: 'string' },
        config: { type: 'string' },
        force: { type: 'boolean', default: false },
        capture: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
        version: { type: 'boolean', short: 'v', default: false },
      },
    });
  } catch (err) {
    console.error(`vsnap: ${(err as Error).message}\nRun \`vsnap --help\` for usage.`);
    return EXIT.usage;
  }
  const { values, positionals } = parsed;
  if (values.version) {
    console.log(VERSION);
    return EXIT.ok;
  }
  const [command, ...args] = positionals;
  if (values.help || !command) {
    console.log(HELP);
    return command || values.help ? EXIT.ok : EXIT.usage;
  }
  const run = COMMANDS[command];
  if (!run) throw new UsageError(`unknown command '${command}'`);
  return run(new Context(command, args, values));
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    if (err instanceof UsageError) {
      console.error(`vsnap: ${err.message}\nRun \`vsnap --help\` for usage.`);
      process.exitCode = EXIT.usage;
    } else if (err instanceof VsnapError) {
      console.error(`vsnap: [${err.code}] ${err.message}`);
      process.exitCode = EXIT.failed;
    } else {
      console.error(err);
      process.exitCode = EXIT.failed;
    }
  },
);
