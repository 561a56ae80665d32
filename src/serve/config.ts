import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

import { isScalar, LineCounter, parseDocument, visit } from 'yaml';

import { VsnapError } from '../errors.js';
import { snapshotNameFor } from '../store/names.js';
import { ConfigSchema, type ServeConfig } from './config-schema.js';

export { ConfigSchema, type ServeConfig, type ServeModelConfig } from './config-schema.js';

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
