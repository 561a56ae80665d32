import { homedir } from 'node:os';
import { join } from 'node:path';

import { EngineClient } from '../engine/engine-client.js';
import { engineToken, engineUrl, storeRoot } from '../settings.js';
import { RegionStore } from '../store/region-store.js';
import { validateName } from '../store/names.js';

/** Exit codes (also in the README and --help). */
export const EXIT = { ok: 0, failed: 1, usage: 2, verifyFailed: 3, interrupted: 130 } as const;

/** Bad usage: exit 2, with the command's help named. */
export class UsageError extends Error {}

/** Every option any command takes (each command declares its own subset). */
export interface Options {
  json?: boolean;
  store?: string;
  id?: string;
  size?: string;
  cpu?: boolean;
  engine?: string;
  token?: string;
  agent?: string;
  config?: string;
  force?: boolean;
  capture?: boolean;
  deep?: boolean;
  recover?: boolean;
  materialize?: string;
  onto?: string;
  all?: boolean;
  out?: string;
  gib?: string;
  gpus?: string;
  dropCaches?: boolean;
  ca?: string;
  codec?: string;
}

/** The default store: $VSNAP_STORE, else $XDG_DATA_HOME/vsnap, else ~/.local/share/vsnap. */
export function defaultStoreRoot(): string {
  const root = storeRoot();
  if (root) return root;
  return join(process.env.XDG_DATA_HOME || join(homedir(), '.local', 'share'), 'vsnap');
}

/**
 * A URL option (`--engine`, `--agent`, or the variable it came from) must be an http(s) URL with a
 * host: anything else is a usage error (exit 2) naming the option and an example.
 */
export function checkHttpUrl(value: string, option: string, example: string): string {
  let url: URL | undefined;
  try {
    url = new URL(value);
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:') || !url.hostname) {
    throw new UsageError(`${option} must be an http(s) URL such as ${example} (got ${JSON.stringify(value)})`);
  }
  return value;
}

/** What every command gets: its arguments, its options, an AbortSignal that Ctrl-C fires, and output helpers. */
export class Context {
  constructor(
    readonly command: string,
    readonly args: string[],
    readonly options: Options,
    readonly signal: AbortSignal,
  ) {}

  get json(): boolean {
    return this.options.json === true;
  }

  get storeRoot(): string {
    if (this.options.store !== undefined) {
      if (this.options.store.trim() === '') throw new UsageError('--store needs a directory (it was empty)');
      return this.options.store;
    }
    return defaultStoreRoot();
  }

  /**
   * The store: `read` for commands that only read it (opened read-only: they work on a store
   * they may not write), `write` for rm and gc, `create` only for commands that write a capture
   * (the rest never make one).
   */
  openStore(access: 'read' | 'write' | 'create'): Promise<RegionStore> {
    return RegionStore.open(this.storeRoot, access === 'read' ? { readOnly: true } : { create: access === 'create' });
  }

  /** The first argument as a snapshot (or model) name, checked: a bad one is a usage error. */
  name(what = 'a snapshot name'): string {
    const n = this.args[0];
    if (!n) throw new UsageError(`${this.command} needs ${what}`);
    if (what === 'a snapshot name') {
      try {
        validateName(n);
      } catch (err) {
        throw new UsageError((err as Error).message);
      }
    }
    return n;
  }

  /** The engine named by --engine or $VSNAP_ENGINE_URL, with --token or $VSNAP_TOKEN. */
  engineClient(): EngineClient {
    const url = this.options.engine ?? engineUrl();
    if (!url) throw new UsageError(`${this.command} needs --engine <url> (or $VSNAP_ENGINE_URL)`);
    checkHttpUrl(url, this.options.engine !== undefined ? '--engine' : '$VSNAP_ENGINE_URL', 'http://127.0.0.1:8000');
    const token = this.options.token ?? engineToken();
    return new EngineClient({ baseUrl: url, ...(token ? { token } : {}) });
  }

  print(human: string, json: unknown): void {
    console.log(this.json ? JSON.stringify(json, null, 2) : human);
  }

  /** A line for people (stderr, so --json output stays one document). */
  note(line: string): void {
    if (!this.json) console.error(line);
  }
}
