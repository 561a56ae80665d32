import { homedir } from 'node:os';
import { join } from 'node:path';

import { EngineClient } from '../engine/engine-client.js';
import { RegionStore } from '../store/region-store.js';

/** Exit codes (also in the README and --help). */
export const EXIT = { ok: 0, failed: 1, usage: 2, verifyFailed: 3 } as const;

export class UsageError extends Error {}

export interface Options {
  store?: string;
  id?: string;
  json: boolean;
  size?: string;
  cpu: boolean;
  engine?: string;
  token?: string;
  agent?: string;
  config?: string;
  force: boolean;
  capture: boolean;
}

/** What every command gets. */
export class Context {
  constructor(
    readonly command: string,
    readonly args: string[],
    readonly options: Options,
  ) {}

  get storeRoot(): string {
    if (this.options.store) return this.options.store;
    if (process.env.VSNAP_STORE) return process.env.VSNAP_STORE;
    return join(process.env.XDG_DATA_HOME || join(homedir(), '.local', 'share'), 'vsnap');
  }

  openStore(create = false): Promise<RegionStore> {
    return RegionStore.open(this.storeRoot, { create });
  }

  name(what = 'a snapshot name'): string {
    const n = this.args[0];
    if (!n) throw new UsageError(`${this.command} needs ${what}`);
    return n;
  }

  engineClient(): EngineClient {
    const url = this.options.engine ?? process.env.VSNAP_ENGINE_URL;
    if (!url) throw new UsageError(`${this.command} needs --engine <url> (or VSNAP_ENGINE_URL)`);
    const token = this.options.token ?? process.env.VSNAP_TOKEN;
    return new EngineClient({ baseUrl: url, ...(token ? { token } : {}) });
  }

  print(human: string, json: unknown): void {
    console.log(this.options.json ? JSON.stringify(json, null, 2) : human);
  }
}
