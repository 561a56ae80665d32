import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

import { isScalar, LineCounter, parseDocument, visit } from 'yaml';
import { z } from 'zod';

import { VsnapError } from '../errors.js';
import { parseReference } from '../registry/reference.js';
import type { ResponseCheckOptions } from '../engine/response-check.js';
import { NAME, snapshotNameFor } from '../store/names.js';

/** A registry reference, checked by the parser the pulls use (so a bad one fails at load, not at the first pull). */
function checkReference(value: string, ctx: z.RefinementCtx): void {
  try {
    parseReference(value);
  } catch (err) {
    ctx.addIssue({ code: 'custom', message: (err as Error).message });
  }
}

/** A device ordinal as a key: `0`, `1`, ... (no leading zeros: `00` would be a second key for GPU 0). */
const DEVICE_KEY = /^(0|[1-9][0-9]*)$/;

const ModelSchema = z
  .object({
    /** An engine that is already running. */
    url: z.string().url().optional(),
    /** Or the command that starts it (vsnap supervises it). `${PORT}` in args is replaced. */
    command: z.string().min(1).optional(),
    args: z.array(z.string()).default([]),
    env: z.record(z.string(), z.string()).default({}),
    port: z.number().int().min(1).max(65535).optional(),
    healthPath: z.string().startsWith('/').default('/health'),
    /** The engine's VSNAP_TOKEN (also given to a started engine). */
    token: z.string().min(1).optional(),
    /** vLLM's --api-key, for /v1 routes. */
    apiKey: z.string().min(1).optional(),
    snapshot: z.string().regex(NAME, 'a snapshot name: 1-128 letters, digits, ".", "_" or "-", starting with a letter or digit').optional(),
    /** A registry reference its snapshot is pulled from when the store lacks it. */
    registry: z.string().superRefine(checkReference).optional(),
    gpus: z.array(z.number().int().nonnegative()).min(1).default([0]),
    memoryGiB: z.number().positive(),
    asleepGiB: z.number().nonnegative().default(0),
    pinned: z.boolean().default(false),
    deepSuspend: z.boolean().default(false),
    check: z
      .object({ mode: z.enum(['prefill', 'decode']).optional(), maxTokens: z.number().int().positive().optional(), prompt: z.string().min(1).optional() })
      .strict()
      .optional(),
    ttlSeconds: z.number().positive().optional(),
    group: z.string().min(1).optional(),
  })
  .strict()
  .superRefine((m, ctx) => {
    if (!m.url && !m.command) ctx.addIssue({ code: 'custom', message: 'give either url (a running engine) or command (to start one)' });
    if (m.command && m.port === undefined) ctx.addIssue({ code: 'custom', path: ['port'], message: 'a started engine needs a port' });
  });

export const ConfigSchema = z
  .object({
    listen: z
      .object({ host: z.string().default('127.0.0.1'), port: z.number().int().min(0).max(65535).default(8080), allowedHosts: z.array(z.string().min(1)).optional() })
      .strict()
      .default({ host: '127.0.0.1', port: 8080 }),
    store: z.string().min(1),
    controlToken: z.string().min(1).optional(),
    apiKey: z.string().min(1).optional(),
    publicStatus: z.boolean().optional(),
    ramTierGiB: z.number().nonnegative().default(0),
    neighbourTier: z.object({ gpu: z.number().int().nonnegative(), budgetGiB: z.number().positive() }).strict().optional(),
    multipath: z.object({ gpu: z.number().int().nonnegative() }).strict().optional(),
    gpus: z.record(z.string().regex(DEVICE_KEY, 'a device ordinal: 0, 1, ... without leading zeros'), z.object({ budgetGiB: z.number().positive() }).strict()),
    defaultModel: z.string().optional(),
    queue: z.object({ limit: z.number().int().positive().default(64), timeoutSeconds: z.number().positive().default(120) }).strict().default({ limit: 64, timeoutSeconds: 120 }),
    startup: z.object({ healthTimeoutSeconds: z.number().positive().default(900), graceSeconds: z.number().positive().default(20) }).strict().default({ healthTimeoutSeconds: 900, graceSeconds: 20 }),
    recovery: z
      .object({ mode: z.enum(['reload', 'fail']).default('reload'), materialize: z.enum(['off', 'async', 'required']).default('async') })
      .strict()
      .default({ mode: 'reload', materialize: 'async' }),
    models: z.record(z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$/, 'a model name'), ModelSchema).refine((m) => Object.keys(m).length > 0, 'at least one model'),
  })
  .strict()
  .superRefine((c, ctx) => {
    if (c.defaultModel && !c.models[c.defaultModel]) ctx.addIssue({ code: 'custom', path: ['defaultModel'], message: `'${c.defaultModel}' is not one of the models` });
    const snapshots = new Map<string, string>();
    const ports = new Map<number, string>();
    if (c.listen.port !== 0) ports.set(c.listen.port, 'listen.port');
    const pinned = new Map<number, number>();
    for (const [name, m] of Object.entries(c.models)) {
      for (const g of m.gpus) {
        const budget = c.gpus[String(g)]?.budgetGiB;
        if (budget === undefined) {
          ctx.addIssue({ code: 'custom', path: ['models', name, 'gpus'], message: `gpu ${g} has no budget under gpus:` });
        } else if (m.memoryGiB > budget) {
          // it could never be woken: a config error now, not an E_BUSY on every request later
          ctx.addIssue({ code: 'custom', path: ['models', name, 'memoryGiB'], message: `${m.memoryGiB} GiB does not fit gpu ${g}'s budget of ${budget} GiB` });
        }
        if (m.pinned) pinned.set(g, (pinned.get(g) ?? 0) + m.memoryGiB);
      }
      if (m.asleepGiB > m.memoryGiB) {
        ctx.addIssue({ code: 'custom', path: ['models', name, 'asleepGiB'], message: `${m.asleepGiB} GiB asleep is more than the ${m.memoryGiB} GiB awake` });
      }
      const snapshot = m.snapshot ?? snapshotNameFor(name);
      const other = snapshots.get(snapshot);
      if (other !== undefined) {
        ctx.addIssue({ code: 'custom', path: ['models', name, 'snapshot'], message: `snapshot '${snapshot}' is also model '${other}''s: give each model its own (snapshot:)` });
      }
      snapshots.set(snapshot, name);
      if (m.command && m.port !== undefined) {
        const taken = ports.get(m.port);
        if (taken !== undefined) ctx.addIssue({ code: 'custom', path: ['models', name, 'port'], message: `port ${m.port} is also ${taken}` });
        ports.set(m.port, `models.${name}.port`);
      }
    }
    const nb = c.neighbourTier;
    const nbBudget = nb ? c.gpus[String(nb.gpu)]?.budgetGiB : undefined;
    if (nb && nbBudget !== undefined && nb.budgetGiB > nbBudget) {
      ctx.addIssue({ code: 'custom', path: ['neighbourTier', 'budgetGiB'], message: `${nb.budgetGiB} GiB is more than gpu ${nb.gpu}'s budget of ${nbBudget} GiB` });
    }
    if (nb && Object.values(c.models).length > 0 && Object.values(c.models).every((m) => m.gpus.length !== 1 || m.gpus[0] === nb.gpu)) {
      ctx.addIssue({ code: 'custom', path: ['neighbourTier', 'gpu'], message: `no model could park there: the tier holds weights of models on one GPU other than gpu ${nb.gpu}` });
    }
    const mp = c.multipath;
    if (mp && c.ramTierGiB <= 0) {
      ctx.addIssue({ code: 'custom', path: ['multipath'], message: 'a restore over two links copies from the RAM tier: set ramTierGiB' });
    }
    if (mp && Object.values(c.models).length > 0 && Object.values(c.models).every((m) => m.gpus.length !== 1 || m.gpus[0] === mp.gpu)) {
      ctx.addIssue({ code: 'custom', path: ['multipath', 'gpu'], message: `no model could use it: it helps models on one GPU other than gpu ${mp.gpu}` });
    }
    for (const [g, total] of pinned) {
      const budget = c.gpus[String(g)]?.budgetGiB;
      if (budget !== undefined && total > budget) {
        ctx.addIssue({ code: 'custom', path: ['gpus', String(g), 'budgetGiB'], message: `the pinned models need ${total} GiB of gpu ${g}, more than its ${budget} GiB: they can never all be awake` });
      }
    }
  });

/**
 * One model of a `vsnap serve` configuration.
 * @public
 */
export interface ServeModelConfig {
  /** An engine that is already running... */
  readonly url?: string | undefined;
  /** ...or the command that starts it (vsnap supervises it); `$\{PORT\}` in args is replaced. */
  readonly command?: string | undefined;
  /** The command's arguments. */
  readonly args: string[];
  /** Environment for the started engine. */
  readonly env: Record<string, string>;
  /** The port of a started engine. */
  readonly port?: number | undefined;
  /** Its health route (default /health). */
  readonly healthPath: string;
  /** The engine's VSNAP_TOKEN (also given to a started engine). */
  readonly token?: string | undefined;
  /** vLLM's --api-key, for /v1 routes. */
  readonly apiKey?: string | undefined;
  /** Its snapshot's name. Filled in at load when absent: the model name with `/` as `--` and `:` as `-` (see {@link snapshotNameForModel}). */
  readonly snapshot?: string | undefined;
  /**
   * A registry reference (`<registry>/<repo>:<tag>`, pushed with `vsnap push`) its snapshot is
   * pulled from, under `snapshot`, when the store lacks it: at start-up, else by its first restore.
   * TLS CA from `$VSNAP_REGISTRY_CA`, credentials from `$VSNAP_REGISTRY_USERNAME` and
   * `$VSNAP_REGISTRY_PASSWORD`, else the Docker config file.
   */
  readonly registry?: string | undefined;
  /** The GPUs it uses. */
  readonly gpus: number[];
  /** GPU memory per device while awake, GiB. */
  readonly memoryGiB: number;
  /** GPU memory per device while suspended, GiB. */
  readonly asleepGiB: number;
  /** Never suspended to make room. */
  readonly pinned: boolean;
  /** Its suspends are deep (the driver's process checkpoint): 0 bytes on its GPUs while asleep. */
  readonly deepSuspend: boolean;
  /** The expected-response check its captures record and every restore re-runs (default: prefill, one token). */
  readonly check?: ResponseCheckOptions | undefined;
  /** Suspended after this long idle. */
  readonly ttlSeconds?: number | undefined;
  /** At most one engine of a group awake at a time. */
  readonly group?: string | undefined;
}

/**
 * The `vsnap serve` configuration (YAML or JSON).
 * @public
 */
export interface ServeConfig {
  /**
   * Where the agent listens (default 127.0.0.1:8080), and the host names it answers to besides
   * IP literals, loopback names, `host` and (listening on every address) this machine's name.
   */
  readonly listen: { host: string; port: number; allowedHosts?: string[] | undefined };
  /** The snapshot store. */
  readonly store: string;
  /** Bearer token of the control routes. */
  readonly controlToken?: string | undefined;
  /** Bearer token clients must send on /v1 routes. */
  readonly apiKey?: string | undefined;
  /** Whether /healthz names engines and /metrics is open without the control token (default: only without one). */
  readonly publicStatus?: boolean | undefined;
  /** Pinned RAM tier, GiB (0: none). */
  readonly ramTierGiB: number;
  /**
   * The neighbour-GPU tier: suspended models' weights parked in this GPU's free memory, within
   * `budgetGiB` (and within that GPU's budget under `gpus:`, when it has one), restored by peer
   * copy (NVLink). For models on one GPU other than `gpu`. See SwapControllerOptions.neighbour.
   */
  readonly neighbourTier?: { gpu: number; budgetGiB: number } | undefined;
  /**
   * Restores from the RAM tier over two PCIe links: part of the bytes through this GPU (its
   * link, then NVLink). For models on one GPU other than `gpu`. See SwapControllerOptions.multipath.
   */
  readonly multipath?: { gpu: number } | undefined;
  /** GPU memory budgets, per device ordinal. */
  readonly gpus: Record<string, { budgetGiB: number }>;
  /** Woken when nothing else is wanted. */
  readonly defaultModel?: string | undefined;
  /** Per-engine request queue. */
  readonly queue: { limit: number; timeoutSeconds: number };
  /** Engine start-up. */
  readonly startup: { healthTimeoutSeconds: number; graceSeconds: number };
  /** When a snapshot cannot be used: reload through the engine's own loader (default) or fail; and whether a new snapshot is captured after (default async). */
  readonly recovery: { mode: 'reload' | 'fail'; materialize: 'off' | 'async' | 'required' };
  /** The models, by name. */
  readonly models: Record<string, ServeModelConfig>;
}

// The schema must produce exactly ServeConfig (checked at compile time).
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const schemaMatches: Same<z.infer<typeof ConfigSchema>, ServeConfig> = true;
void schemaMatches;

interface ConfigIssue {
  path: string;
  line: number;
  column: number;
  message: string;
  /** The message continues the path as a sentence ("models.x.port is required") instead of following a colon. */
  sentence?: boolean;
}

/** Whether the value at `path` is absent: its parent is an object without that key. */
function isMissing(root: unknown, path: ReadonlyArray<string | number>): boolean {
  let node: unknown = root;
  for (const key of path.slice(0, -1)) {
    if (node === null || typeof node !== 'object') return false;
    node = (node as Record<string | number, unknown>)[key];
  }
  return node !== null && typeof node === 'object' && !Object.prototype.hasOwnProperty.call(node, path[path.length - 1]!);
}

/** "a number", "an object", from zod's expected type. */
function article(expected: string): string {
  return `${/^[aeiou]/.test(expected) ? 'an' : 'a'} ${expected}`;
}

/**
 * Where YAML's first error is the brace of an unquoted `${...}` (a plain scalar may hold braces in
 * block style, but inside a flow collection `{` starts a mapping): that reference and its offset.
 */
function unquotedEnvInFlow(text: string, errorAt: number): { text: string; offset: number } | undefined {
  for (const offset of [errorAt - 1, errorAt]) {
    const m = /^\$\{[^}\s]*\}?/.exec(text.slice(Math.max(0, offset)));
    if (offset >= 0 && m && m[0].length > 2) return { text: m[0], offset };
  }
  return undefined;
}

/** `${env:NAME}` anywhere in a string is replaced by that environment variable. */
function expandEnv(value: unknown, env: NodeJS.ProcessEnv, path: Array<string | number>, missing: ConfigIssue[]): unknown {
  if (typeof value === 'string') {
    return value.replace(/\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}/g, (_m, name: string) => {
      const v = env[name];
      if (v === undefined) missing.push({ path: path.join('.'), line: 0, column: 0, message: `environment variable ${name} is not set` });
      return v ?? '';
    });
  }
  if (Array.isArray(value)) return value.map((v, i) => expandEnv(v, env, [...path, i], missing));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, expandEnv(v, env, [...path, k], missing)]));
  }
  return value;
}

/**
 * Reads and validates a configuration file. Throws E_CONFIG listing every problem with its path
 * and, for YAML and JSON alike, its line and column.
 * @public
 */
export function loadConfig(path: string, env: NodeJS.ProcessEnv = process.env): ServeConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new VsnapError('E_CONFIG', `cannot read the configuration ${path}: ${(err as Error).message}`, { path });
  }
  return parseConfig(text, path, env);
}

/** @internal */
export function parseConfig(text: string, source: string, env: NodeJS.ProcessEnv = process.env): ServeConfig {
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, prettyErrors: false }); // JSON is YAML too
  if (doc.errors.length) {
    const unquoted = unquotedEnvInFlow(text, doc.errors[0]!.pos[0]);
    if (unquoted) {
      // one mistake, one problem: the parser's later errors all follow from this one
      const at = lines.linePos(unquoted.offset);
      throw configError(source, [{ path: '(syntax)', line: at.line, column: at.col, message: `${unquoted.text} is not quoted inside a flow mapping or list ({...} or [...]), where YAML reads its braces as a mapping: quote it: "${unquoted.text}"` }]);
    }
    const issues = doc.errors.map((e) => {
      const at = lines.linePos(e.pos[0]);
      return { path: '(syntax)', line: at.line, column: at.col, message: e.message.split('\n')[0]! };
    });
    throw configError(source, issues);
  }
  // A `__proto__` key would set the prototype of the object it lands in (and vanish from the
  // configuration): refused wherever it appears, with its line.
  const reserved: ConfigIssue[] = [];
  visit(doc, {
    // Keys equal once read as text (`0` and `"0"`) would silently replace one another.
    Map(_key, map, path) {
      const seen = new Set<string>();
      for (const pair of map.items) {
        if (!isScalar(pair.key)) continue;
        const text = String(pair.key.value);
        if (seen.has(text)) {
          const at = lines.linePos(pair.key.range?.[0] ?? 0);
          reserved.push({ path: [...keysOf(path), text].join('.'), line: at.line, column: at.col, message: `the key "${text}" appears twice in this mapping (written differently): keep one` });
        }
        seen.add(text);
      }
    },
    Pair(_key, pair, path) {
      if (isScalar(pair.key) && String(pair.key.value) === '__proto__') {
        const at = lines.linePos(pair.key.range?.[0] ?? 0);
        reserved.push({ path: [...keysOf(path), '__proto__'].join('.'), line: at.line, column: at.col, message: '"__proto__" cannot be a key (it is not a valid name anywhere in the configuration)' });
      }
    },
  });
  if (reserved.length) throw configError(source, reserved);
  let js: unknown;
  try {
    js = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    // yaml refuses alias expansion past maxAliasCount (an alias bomb): say where the aliases are.
    let first: number | undefined;
    visit(doc, {
      Alias(_key, node) {
        first = node.range?.[0];
        return visit.BREAK;
      },
    });
    const at = first !== undefined ? lines.linePos(first) : { line: 0, col: 0 };
    throw configError(source, [{ path: '(syntax)', line: at.line, column: at.col, message: `the YAML cannot be expanded: ${(err as Error).message} (too many alias references)` }]);
  }
  const missing: ConfigIssue[] = [];
  const raw = expandEnv(js, env, [], missing);
  const result = ConfigSchema.safeParse(raw);
  const issues = [
    ...missing,
    ...(result.success
      ? []
      : result.error.issues.map((i) => {
          const node = locate(doc, i.path as Array<string | number>);
          const at = node ? lines.linePos(node) : { line: 0, col: 0 };
          // a record key's own message (zod wraps it in "Invalid key in record")
          const inner = i.code === 'invalid_key' ? i.issues[0]?.message : undefined;
          // a key that is not there at all: "models.x.port is required (a number)", at the mapping that lacks it
          if (i.code === 'invalid_type' && i.path.length > 0 && isMissing(raw, i.path as Array<string | number>)) {
            return { path: i.path.join('.'), line: at.line, column: at.col, message: `is required (${article(i.expected)})`, sentence: true };
          }
          return { path: i.path.join('.') || '(root)', line: at.line, column: at.col, message: inner ?? i.message };
        })),
  ];
  if (issues.length || !result.success) throw configError(source, issues);
  // Every model gets a valid snapshot name now, so a model name never fails later as one.
  for (const [name, m] of Object.entries(result.data.models)) m.snapshot ??= snapshotNameFor(name);
  return result.data;
}

/** The keys leading to a node, from the ancestors `visit` passes. */
function keysOf(path: readonly unknown[]): string[] {
  return path.filter((n): n is { key: unknown } => typeof n === 'object' && n !== null && 'key' in n).map((n) => (isScalar(n.key) ? String(n.key.value) : '?'));
}

/**
 * The snapshot name a model of a `vsnap serve` configuration gets when it names none: the model
 * name with `/` as `--` and `:` as `-` (`meta-llama/Llama-3.1-8B` → `meta-llama--Llama-3.1-8B`).
 * @public
 */
export function snapshotNameForModel(model: string): string {
  return snapshotNameFor(model);
}

/**
 * Checks, before any engine boots, that the agent's listen address and the port of every engine
 * vsnap starts are free: binds each for a moment and lets it go. Throws E_ADDRESS_IN_USE naming
 * every port in use (or E_CONFIG for an address that cannot be bound at all).
 * @public
 */
export async function checkPorts(config: ServeConfig): Promise<void> {
  const wanted: Array<{ what: string; host: string; port: number }> = [];
  if (config.listen.port !== 0) wanted.push({ what: 'listen', host: config.listen.host, port: config.listen.port });
  for (const [name, m] of Object.entries(config.models)) {
    if (m.command && m.port !== undefined) wanted.push({ what: `models.${name}.port`, host: '127.0.0.1', port: m.port });
  }
  const problems: Array<{ what: string; host: string; port: number; errno: string }> = [];
  for (const w of wanted) {
    const errno = await tryBind(w.host, w.port);
    if (errno) problems.push({ ...w, errno });
  }
  if (problems.length === 0) return;
  const lines = problems.map((p) => `  ${p.what}: ${p.host}:${p.port} (${p.errno})`).join('\n');
  const inUse = problems.every((p) => p.errno === 'EADDRINUSE');
  throw new VsnapError(
    inUse ? 'E_ADDRESS_IN_USE' : 'E_CONFIG',
    `${inUse ? 'ports already in use' : 'addresses that cannot be bound'}; nothing was started:\n${lines}\nStop what holds them or choose other ports.`,
    { ports: problems },
  );
}

/** Binds host:port for a moment; returns the error code, or undefined when free. */
function tryBind(host: string, port: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'EUNKNOWN'));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(undefined)));
  });
}

/** The offset of the deepest node of `path` that exists in the document. */
function locate(doc: ReturnType<typeof parseDocument>, path: Array<string | number>): number | undefined {
  for (let n = path.length; n >= 0; n--) {
    const node = n === 0 ? doc.contents : doc.getIn(path.slice(0, n), true);
    const range = (node as { range?: [number, number, number] } | undefined)?.range;
    if (range) return range[0];
  }
  return undefined;
}

function configError(source: string, issues: ConfigIssue[]): VsnapError {
  const lines = issues.map((i) => `  ${source}${i.line ? `:${i.line}:${i.column}` : ''} ${i.path}${i.sentence ? ' ' : ': '}${i.message}`);
  return new VsnapError('E_CONFIG', `the configuration is invalid (${issues.length} problem${issues.length === 1 ? '' : 's'}):\n${lines.join('\n')}`, { issues });
}
