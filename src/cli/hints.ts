import type { ErrorCode } from '../errors.js';

/**
 * The one table that turns the SDK's errors into the command line's terms: what the SDK calls an
 * option (`captureIfNeeded`, `EngineClientOptions.token`, `create: true`) becomes the flag a user
 * types, and each error code gets a hint naming the vsnap command that helps.
 */
const TERMS: Array<[RegExp, string]> = [
  [/Capture a snapshot first \(Snapshot\.captureEngine\), or pass captureIfNeeded\./g, 'Capture one first (`vsnap snapshot <name> --engine <url>`), or pass --capture.'],
  [/\bcaptureIfNeeded\b/g, '--capture'],
  [/check EngineClientOptions\.token \/ apiKey/g, 'check --token (or $VSNAP_TOKEN)'],
  [/EngineClientOptions\.token/g, '--token'],
  [/ \(pass create: true to make one\)/g, ''],
  [/\bSnapshot\.captureEngine\b/g, 'vsnap snapshot'],
];

/** What a hint may look at besides the command: the error's details (an HTTP status, say). */
type HintDetails = Readonly<Record<string, unknown>> | undefined;
type Hint = string | ((command: string, details: HintDetails) => string | undefined);

const HINTS: Partial<Record<ErrorCode | 'E_USAGE', Hint>> = {
  E_USAGE: (c) => `see \`vsnap ${c || ''} --help\``.replace('  ', ' '),
  E_INVALID_NAME: 'snapshot names are 1-128 letters, digits, ".", "_" or "-", starting with a letter or digit',
  E_STORE_INVALID: (c) =>
    c === 'serve'
      ? "check the configuration's `store`"
      : c === 'snapshot' || c === 'suspend' || c === 'demo' || c === 'pull'
      ? 'check --store (or $VSNAP_STORE)'
      : 'check --store (or $VSNAP_STORE); a store is made by the first `vsnap snapshot`, `vsnap pull` or `vsnap demo` into it',
  E_STORE_LOCKED: 'another vsnap process is using the store; let it finish, then try again',
  E_SNAPSHOT_NOT_FOUND: (c) =>
    c === 'pull' ? 'check the repository and tag: the registry has no snapshot there' : 'list what the store has with `vsnap ls --all`; make a snapshot with `vsnap snapshot <name> --engine <url>`',
  E_NOT_RESTORABLE: (c) => (c === 'suspend' ? 'pass --capture to capture one first, or run `vsnap snapshot <name> --engine <url>`' : 'run `vsnap snapshot <name> --engine <url>` first'),
  E_CHECKSUM: (c) => (c === 'verify' ? 'remove the damaged capture with `vsnap rm <name> --id <id>` and capture again' : 'check the snapshot with `vsnap verify <name>`; if damaged, `vsnap rm` it and capture again'),
  E_BLOB_TRUNCATED: 'the snapshot is damaged: `vsnap rm <name> --id <id>`, then capture again with `vsnap snapshot <name> --force`',
  E_BLOB_MISSING: 'the snapshot is damaged: `vsnap rm <name> --id <id>`, then capture again with `vsnap snapshot <name> --force`',
  E_MANIFEST_MISMATCH: 'the engine does not match this snapshot (another model or layout): capture it with `vsnap snapshot <name> --force`',
  E_ENGINE_UNREACHABLE: (c) => (c === 'swap' ? 'is `vsnap serve` running at --agent <url> (or $VSNAP_AGENT_URL)?' : 'is the engine running at --engine <url> (or $VSNAP_ENGINE_URL)?'),
  E_ENGINE_HTTP: (c, d) => {
    const status = d?.status;
    if (c === 'swap') {
      if (status === 401) return "pass the agent's control token with --token (or $VSNAP_CONTROL_TOKEN)";
      if (status === 503 && d?.agentCode === 'E_CONTROL_OFF') return 'the agent has no controlToken: set one in its --config file to use `vsnap swap`';
      return "the agent's status page (GET / of --agent) and its log say more";
    }
    if (status === 401 || status === 503) return "pass the engine's VSNAP_TOKEN with --token (or $VSNAP_TOKEN); `vsnap status --engine <url>` checks the connection";
    return '`vsnap status --engine <url>` checks the connection; the engine\'s log says more';
  },
  E_ENGINE_STATE: (c) =>
    c === 'serve' ? "the engine's own output is above, each line prefixed with its model's name; check its `command:`, `args:` and `env:` in the --config file" : 'see `vsnap status --engine <url>`',
  E_NO_SPACE: 'free space with `vsnap rm <name>` and `vsnap gc`, or choose another --store',
  E_CUDA_UNAVAILABLE: '`vsnap doctor` says why; `vsnap demo --cpu` runs without a GPU',
  E_CHECKPOINT_UNSUPPORTED: '`vsnap doctor` shows checkpointApi; suspend without --deep',
  E_CHECKPOINT: 'see `vsnap status --engine <url>`; `vsnap restore <name>` restores and unlocks a deep-suspended engine',
  E_CONFIG: (c) =>
    c === 'serve'
      ? 'fix the file given to --config (its JSON Schema: schema/serve-config.schema.json), or the environment variable the message names (docs/configuration.md)'
      : 'fix the environment variable or file the message names (docs/configuration.md lists every setting and what it accepts)',
  E_ADDRESS_IN_USE: "another process listens there: change listen.port in the --config file",
  E_ABORTED: 'interrupted: nothing was kept, temporary files were removed',
  E_BUSY: 'the agent is busy: try again shortly',
  E_REGISTRY: 'check the reference (<registry>/<repo>:<tag>; http:// first for a plain-HTTP registry) and --ca for a private CA',
  E_REGISTRY_AUTH: '`docker login <registry>` (vsnap reads ~/.docker/config.json or $DOCKER_CONFIG), or set $VSNAP_REGISTRY_USERNAME and $VSNAP_REGISTRY_PASSWORD',
  E_REGISTRY_TIMEOUT: 'the registry (or the network path to it) stalled or sent too slowly: try again (an interrupted pull keeps nothing)',
  E_UNKNOWN_MODEL: 'the models served are listed at GET /v1/models of the agent',
};

/** The SDK's message in the command line's terms. */
export function cliMessage(message: string, command: string): string {
  let out = message;
  for (const [from, to] of TERMS) out = out.replace(from, to);
  if (command === 'verify') out = out.replace(/Run `vsnap verify` and recapture/g, 'Recapture').replace(/,? *\(?run `vsnap verify[^`]*`\)?/gi, '');
  return out;
}

/** The hint for an error code, in the command line's terms (undefined when there is none); `details` are the error's (an HTTP status picks the hint of an HTTP error). */
export function cliHint(code: string, command: string, details?: HintDetails): string | undefined {
  const h = HINTS[code as ErrorCode | 'E_USAGE'];
  return typeof h === 'function' ? h(command, details) : h;
}
