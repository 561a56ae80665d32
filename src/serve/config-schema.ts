// The vsnap serve configuration: its zod schema and the types it produces (config.ts loads it).
import type { ResponseCheckOptions } from 'vsnap';
import { z } from 'zod';

import { parseReference } from '../registry/reference.js';
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

/** A bearer token: what a client can send in `Authorization: Bearer <token>` (printable ASCII, no space). */
const BEARER = z
  .string()
  .min(1)
  .refine((t) => !/\s/.test(t), 'a bearer token cannot hold whitespace (a client sends it as `Authorization: Bearer <token>`, which ends at the first space): remove it')
  .refine((t) => /^[\x21-\x7e]*$/.test(t.replace(/\s/g, '')), 'a bearer token must be printable ASCII (no NUL, control or non-ASCII characters: an HTTP header cannot carry them as written): use letters, digits and punctuation');

/** An allowedHosts entry: a host name (or `.suffix`, or `*`), compared with the Host header's name without its port. */
const ALLOWED_HOST = z
  .string()
  .min(1)
  .refine((h) => !/^[^[\]:]+:\d*$/.test(h.trim()) && !/^\[[^\]]*\]:\d*$/.test(h.trim()), 'a host name without a port: the Host check compares names only, whatever the port (write "example.com", not "example.com:8080")')
  .refine((h) => !/[/@\s]/.test(h.trim()) || h === '*', 'a host name only (no scheme, path, user or space): "example.com", ".example.com" for its subdomains, or "*"');

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
    token: BEARER.optional(),
    /** vLLM's --api-key, for /v1 routes. */
    apiKey: BEARER.optional(),
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
      .object({
        host: z.string().default('127.0.0.1'),
        port: z.number().int().min(0).max(65535).default(8080),
        allowedHosts: z.array(ALLOWED_HOST).optional(),
        bodyStallSeconds: z.number().positive().default(10),
        responseStallSeconds: z.number().positive().default(30),
      })
      .strict()
      .default({ host: '127.0.0.1', port: 8080, bodyStallSeconds: 10, responseStallSeconds: 30 }),
    store: z.string().min(1),
    controlToken: BEARER.optional(),
    apiKey: BEARER.optional(),
    publicStatus: z.boolean().optional(),
    ramTierGiB: z.number().nonnegative().default(0),
    codec: z.enum(['vsnap-c1', 'off']).default('off'),
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
  readonly listen: {
    host: string;
    port: number;
    allowedHosts?: string[] | undefined;
    /** A request body that sends nothing for this long gets 408; one waiting this long for room in the body budget, 429 (default 10). */
    bodyStallSeconds: number;
    /** A response that sends none of its waiting bytes for this long (a client that stopped reading) is closed, and its engine let go (default 30). */
    responseStallSeconds: number;
  };
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
   * How snapshots are held wherever serve writes them: `vsnap-c1` codes each chunk that shrinks
   * (docs/compression.md) in the RAM tier (RamTierOptions.codec) and in the store blobs of the
   * captures serve makes (CaptureOptions.codec: at boot, on a suspend that captures first, the
   * snapshot route, and the capture after a recovery); `off` (default) holds the raw bytes.
   */
  readonly codec: 'vsnap-c1' | 'off';
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

