import { VsnapError } from './errors.js';

/*
 * Every environment variable the SDK and the CLI read, read and checked here and nowhere else
 * (scripts/check-settings.mjs fails CI on a `process.env.VSNAP_*` read anywhere else in src/).
 * Each is read when it is used, not when a module loads, so a test (or a program) may set it
 * first. An empty value counts as unset. docs/configuration.md lists the same variables.
 */

/** The environment a setting is read from: `process.env` unless a caller hands its own. @internal */
export type Environment = Readonly<Record<string, string | undefined>>;

/** What a setting is for, what it accepts and what holds when it is unset. @internal */
export interface SettingInfo {
  /** Who reads it: the SDK (every program using vsnap), the CLI, or `vsnap serve`. */
  readonly readBy: string;
  /** The values it accepts, as the E_CONFIG message says it. */
  readonly accepts: string;
  /** What holds when it is unset (or empty). */
  readonly default: string;
  /** What it does, for docs/configuration.md. */
  readonly meaning: string;
}

/** Every setting, by variable name (docs/configuration.md is generated from this table). @internal */
export const SETTINGS = {
  VSNAP_NATIVE_PATH: {
    readBy: 'SDK',
    accepts: 'the path of a vsnap.node addon file',
    default: "the package's own build, else its prebuild",
    meaning: 'The native addon to load first (one you built); when it cannot load, the error lists it beside every other attempt.',
  },
  VSNAP_STAGING_IDLE_MS: {
    readBy: 'SDK',
    accepts: 'a whole number of milliseconds from 0 to 2147483647',
    default: '30000',
    meaning: 'How long pinned staging memory (and the window buffers of restores of coded store blobs), the CUDA contexts kept for GPUs a transfer touched and neighbour-GPU contexts stay after their last use. `releaseIdleResources()` frees them at once.',
  },
  VSNAP_STORE: {
    readBy: 'CLI',
    accepts: 'a directory',
    default: '$XDG_DATA_HOME/vsnap, else ~/.local/share/vsnap',
    meaning: 'The store of every command (`--store` wins).',
  },
  VSNAP_ENGINE_URL: {
    readBy: 'CLI',
    accepts: 'an http(s) URL such as http://127.0.0.1:8000',
    default: 'none: commands that need an engine ask for --engine',
    meaning: 'The engine (vLLM with the vsnap plugin) of `snapshot`, `suspend`, `restore`, `status`, `doctor` and `pull` (`--engine` wins).',
  },
  VSNAP_TOKEN: {
    readBy: 'CLI',
    accepts: "the engine's bearer token (its own VSNAP_TOKEN)",
    default: 'none: no token is sent',
    meaning: 'The token the CLI sends to the engine (`--token` wins).',
  },
  VSNAP_AGENT_URL: {
    readBy: 'CLI',
    accepts: 'an http(s) URL such as http://127.0.0.1:8080',
    default: 'http://127.0.0.1:8080',
    meaning: 'The running `vsnap serve` that `vsnap swap` asks (`--agent` wins).',
  },
  VSNAP_CONTROL_TOKEN: {
    readBy: 'CLI',
    accepts: "the agent's control token",
    default: 'none: no token is sent',
    meaning: 'The control token `vsnap swap` sends (`--token` wins); the agent\'s own is `controlToken` in its configuration.',
  },
  VSNAP_REGISTRY_CA: {
    readBy: 'CLI, serve',
    accepts: "the path of a PEM file with the registry's CA",
    default: "the system's CAs",
    meaning: 'The CA of a private registry, for `push`, `pull` and the `registry:` of a served model (`--ca` wins).',
  },
  VSNAP_REGISTRY_USERNAME: {
    readBy: 'CLI, serve',
    accepts: 'a registry user name (used only with VSNAP_REGISTRY_PASSWORD)',
    default: 'the Docker config file ($DOCKER_CONFIG, else ~/.docker/config.json)',
    meaning: 'Registry credentials, with VSNAP_REGISTRY_PASSWORD; either alone is not used.',
  },
  VSNAP_REGISTRY_PASSWORD: {
    readBy: 'CLI, serve',
    accepts: 'a registry password or token (used only with VSNAP_REGISTRY_USERNAME)',
    default: 'the Docker config file ($DOCKER_CONFIG, else ~/.docker/config.json)',
    meaning: 'Registry credentials, with VSNAP_REGISTRY_USERNAME; either alone is not used.',
  },
} as const satisfies Record<string, SettingInfo>;

/** The name of a setting. @internal */
export type SettingName = keyof typeof SETTINGS;

/** The value of `name`, or undefined when it is unset or empty. */
function raw(name: SettingName, env: Environment): string | undefined {
  const value = env[name];
  return value === undefined || value === '' ? undefined : value;
}

/** The E_CONFIG error of a value `name` does not accept (the value is not repeated: it may be a secret). */
function invalid(name: SettingName, why: string): VsnapError {
  const { accepts } = SETTINGS[name];
  const message = `$${name} ${why}: it accepts ${accepts}. Fix it, or unset it for the default`;
  return new VsnapError('E_CONFIG', `${message}.`, { variable: name, accepts, issues: [{ path: name, message }] });
}

/** `$VSNAP_NATIVE_PATH`: the addon file to load before the package's own. @internal */
export function nativePath(env: Environment = process.env): string | undefined {
  return raw('VSNAP_NATIVE_PATH', env);
}

/** The largest delay a Node timer honours (a longer one fires at once). */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * `$VSNAP_STAGING_IDLE_MS`: how long pinned staging memory, kept GPU contexts and neighbour
 * contexts stay after their last use (default 30 s). Throws E_CONFIG for a value it does not accept.
 * @internal
 */
export function stagingIdleMs(env: Environment = process.env): number {
  const value = raw('VSNAP_STAGING_IDLE_MS', env);
  if (value === undefined) return 30_000;
  const ms = /^\d+$/.test(value) ? Number(value) : NaN;
  if (!(ms <= MAX_TIMER_MS)) throw invalid('VSNAP_STAGING_IDLE_MS', `is ${JSON.stringify(value)}`);
  return ms;
}

/** `$VSNAP_STORE`: the CLI's store. @internal */
export function storeRoot(env: Environment = process.env): string | undefined {
  return raw('VSNAP_STORE', env);
}

/** `$VSNAP_ENGINE_URL`: the CLI's engine (the CLI checks it is an http(s) URL, naming the variable). @internal */
export function engineUrl(env: Environment = process.env): string | undefined {
  return raw('VSNAP_ENGINE_URL', env);
}

/** `$VSNAP_TOKEN`: the bearer token the CLI sends to its engine. @internal */
export function engineToken(env: Environment = process.env): string | undefined {
  return raw('VSNAP_TOKEN', env);
}

/** `$VSNAP_AGENT_URL`: the running `vsnap serve` that `vsnap swap` asks. @internal */
export function agentUrl(env: Environment = process.env): string | undefined {
  return raw('VSNAP_AGENT_URL', env);
}

/** `$VSNAP_CONTROL_TOKEN`: the agent's control token `vsnap swap` sends. @internal */
export function controlToken(env: Environment = process.env): string | undefined {
  return raw('VSNAP_CONTROL_TOKEN', env);
}

/** `$VSNAP_REGISTRY_CA`: the file of the registry's CA, for push and pull. @internal */
export function registryCaFile(env: Environment = process.env): string | undefined {
  return raw('VSNAP_REGISTRY_CA', env);
}

/**
 * `$VSNAP_REGISTRY_USERNAME` and `$VSNAP_REGISTRY_PASSWORD`, when both are set (either alone is
 * not used: the Docker config file is read instead). @internal
 */
export function registryCredentials(env: Environment = process.env): { username: string; password: string } | undefined {
  const username = raw('VSNAP_REGISTRY_USERNAME', env);
  const password = raw('VSNAP_REGISTRY_PASSWORD', env);
  return username !== undefined && password !== undefined ? { username, password } : undefined;
}
