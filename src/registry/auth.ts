import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

import { VsnapError } from '../errors.js';

/**
 * Credentials for a registry: a user name and password (or identity token), used for basic
 * auth and to obtain bearer tokens.
 * @public
 */
export interface RegistryCredentials {
  /** The user name (for a token, whatever name the registry expects with it). */
  readonly username: string;
  /** The password, or a personal access token. */
  readonly password: string;
}

/**
 * Credentials for `host` from the Docker config file (`$DOCKER_CONFIG/config.json`, else
 * `~/.docker/config.json`): the `auths` entry for the host (also matched as `https://host` and
 * `https://host/v1/` as docker login writes them), its base64 `auth` ("user:password") or its
 * `username`/`password`. Credential helpers (`credsStore`) are not run. Undefined when none.
 * @internal
 */
export function dockerConfigCredentials(host: string, env: NodeJS.ProcessEnv = process.env): RegistryCredentials | undefined {
  const dir = env.DOCKER_CONFIG || join(homedir(), '.docker');
  const path = join(dir, 'config.json');
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
  let config: { auths?: Record<string, { auth?: string; username?: string; password?: string; identitytoken?: string }> };
  try {
    config = JSON.parse(text) as typeof config;
  } catch (err) {
    throw new VsnapError('E_CONFIG', `${path} is not valid JSON (${(err as Error).message}); fix it or point DOCKER_CONFIG elsewhere`, { path });
  }
  const auths = config.auths ?? {};
  for (const key of [host, `https://${host}`, `http://${host}`, `https://${host}/v1/`, `${host}/v1/`]) {
    const entry = auths[key];
    if (!entry) continue;
    if (entry.auth) {
      const decoded = Buffer.from(entry.auth, 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      if (colon < 0) throw new VsnapError('E_CONFIG', `${path}: auths["${key}"].auth is not base64 of "user:password"`, { path });
      return { username: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
    }
    if (entry.username !== undefined && entry.password !== undefined) return { username: entry.username, password: entry.password };
  }
  return undefined;
}

/** One parsed `WWW-Authenticate` challenge. @internal */
export interface Challenge {
  readonly scheme: string;
  readonly params: Readonly<Record<string, string>>;
}

/**
 * Parses a `WWW-Authenticate` header (RFC 7235): `Bearer realm="...",service="...",scope="..."`
 * or `Basic realm="..."`. Only the first challenge is used, as registries send one.
 * @internal
 */
export function parseChallenge(header: string | undefined): Challenge | undefined {
  if (!header) return undefined;
  const m = /^\s*([A-Za-z][A-Za-z0-9_-]*)\s*(.*)$/s.exec(header);
  if (!m) return undefined;
  const params: Record<string, string> = {};
  const re = /([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?\s*/gy;
  const rest = m[2]!;
  re.lastIndex = 0;
  let p: RegExpExecArray | null;
  while (re.lastIndex < rest.length && (p = re.exec(rest)) !== null) {
    params[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!;
  }
  return { scheme: m[1]!.toLowerCase(), params };
}

/** The Authorization header value of basic auth. @internal */
export function basicHeader(c: RegistryCredentials): string {
  return `Basic ${Buffer.from(`${c.username}:${c.password}`).toString('base64')}`;
}
