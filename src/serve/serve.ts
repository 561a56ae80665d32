import type * as vsnap from 'vsnap';

import { RamTier } from '../cache/ram-tier.js';
import { EngineClient } from '../engine/engine-client.js';
import { VsnapError } from '../errors.js';
import { RegistryClient } from '../registry/registry.js';
import { registryOptionsFromEnv, type RegistrySource } from '../registry/source.js';
import { RegionStore } from '../store/region-store.js';
import { registerStoreMetrics } from './store-metrics.js';
import { SwapController, type SwapEvent } from '../swap/controller.js';
import { SwapAgent } from './agent.js';
import { bootEngines, progressLog } from './boot.js';
import { checkPorts, type ServeConfig } from './config.js';
import { budgetsOf, bytesOf, controllerOptionsOf } from './controller-options.js';
import { EngineRecord } from './engine-record.js';
import { ModelReadinessBoard, type ModelReadinessSource } from './model-readiness.js';
import { checkCommand, Supervisor, type SupervisorOptions } from './supervisor.js';
import { Teardown } from './teardown.js';

const GiB = 2 ** 30;

/**
 * Options of {@link serve}.
 * @public
 */
export interface ServeOptions {
  /** The operator's log (default: stderr). */
  readonly log?: (line: string) => void;
  /**
   * Where serve keeps the record of the engine processes it started (one file per store and
   * listen address), so the next start after a serve that died stops what it left behind.
   * Default `$XDG_STATE_HOME/vsnap/serve` (else `~/.local/state/vsnap/serve`).
   */
  readonly stateDir?: string;
  /** The signal engines get when serve dies (see {@link SupervisorOptions.parentDeathSignal}). Default SIGTERM. */
  readonly parentDeathSignal?: NodeJS.Signals | false;
  /** A pull that has made no progress for this long is logged (again after each such period). Default 30 s. */
  readonly pullStallLogMs?: number;
}

/**
 * A running `vsnap serve`: supervised engines, the controller and the agent.
 * @public
 */
export interface ServeHandle {
  /** The HTTP agent. */
  readonly agent: SwapAgent;
  /** The controller. */
  readonly controller: vsnap.SwapController;
  /** The supervisor of the engines vsnap started. */
  readonly supervisor: Supervisor;
  /** Every model's readiness (a model is ready once its engine is up and its snapshot is in place). */
  readonly readiness: ModelReadinessSource;
  /**
   * Settles when the boot is over: resolves once every model is ready; rejects with the error
   * of an engine that could not be booted (the rest of the boot stops there; serve keeps
   * answering, those models stay not ready). `vsnap serve` exits 1 on a rejection.
   */
  readonly booted: Promise<void>;
  /**
   * Stops the agent (requests being answered get `startup.graceSeconds` to finish, then their
   * connections are closed), the boot if it still runs, the controller and every engine vsnap
   * started. Idempotent.
   */
  close(): Promise<void>;
}

/**
 * Runs a configuration. First stops what a previous serve with the same store and listen
 * address left running when it died (its record in {@link ServeOptions.stateDir}), refuses a
 * listen or engine port already in use (`E_ADDRESS_IN_USE`) before any engine boots, then
 * listens at once and boots in the background: the engines that have a command start one at a
 * time (each captured if no snapshot matches it, or first pulled from its `registry`, then
 * suspended, so N engines boot warm with none resident); engines that need a pull boot last.
 * Until a model is ready, requests for it get 503 E_NOT_READY with the reason, and `/healthz`
 * and the status page say why; engines still booting count as awake for the GPU budgets, so no
 * model is woken beside an engine that is loading unless the budget has room for both. Resolves
 * once it listens; {@link ServeHandle.booted} tells when the boot is over.
 * @public
 */
export async function serve(config: ServeConfig, options: ServeOptions = {}): Promise<ServeHandle> {
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const teardown = new Teardown(log);
  try {
    return await start(config, options, log, teardown);
  } catch (err) {
    await teardown.run(); // a start that failed half-way stops what it started, the same way close() does
    throw err;
  }
}

/** Starts the parts in order, each adding its stop to `teardown`. */
async function start(config: ServeConfig, options: ServeOptions, log: (line: string) => void, teardown: Teardown): Promise<ServeHandle> {
  const graceMs = config.startup.graceSeconds * 1000;
  const record = await stopLeftovers(config, options, log, graceMs);
  teardown.add('the engine record', () => record.remove());
  await checkPorts(config);
  // an engine command that is not there is a mistake in the configuration: said before anything starts
  for (const [name, m] of Object.entries(config.models)) if (m.command) checkCommand({ name, command: m.command, env: m.env });
  warnOpenListen(config, log);
  const store = await RegionStore.open(config.store);
  const clients = engineClients(config);
  teardown.add('the engine clients', async () => {
    for (const c of clients.values()) await c.close();
  });
  const sources = registrySources(config, log);
  // Which models need a pull (a registry source, and the store lacks the snapshot): their engines boot last.
  const needsPull = new Set<string>();
  for (const name of sources.keys()) if (!(await store.current(config.models[name]!.snapshot ?? name))) needsPull.add(name);
  const started = Object.keys(config.models)
    .filter((name) => config.models[name]!.command)
    .sort((a, b) => Number(needsPull.has(a)) - Number(needsPull.has(b)));
  const ram = config.ramTierGiB > 0 ? await RamTier.create({ budgetBytes: bytesOf(config.ramTierGiB), codec: config.codec }) : undefined;
  if (ram) teardown.add('the RAM tier', () => ram.close());
  const readiness = new ModelReadinessBoard(Object.keys(config.models));
  for (const name of needsPull) if (!config.models[name]!.command) readiness.set(name, 'pulling', `pulling its snapshot from ${sources.get(name)!.reference}`);
  let booted: Promise<void> | undefined;
  teardown.add('the boot', () => booted?.catch(() => undefined)); // after the engines stop (below), so it ends
  const supervisor = superviseEngines(config, started, { record, readiness, log, graceMs, options });
  teardown.add('the engines', () => supervisor.stop());
  const controller = await SwapController.create(controllerOptionsOf(config, { store, clients, sources, ram, booting: started }));
  teardown.add('the controller', () => controller.close()); // the swap in flight, if any, ends before the engines stop
  logControllerEvents(controller, log);
  registerStoreMetrics(controller.registry, store);
  const agent = await SwapAgent.listen({
    controller,
    store,
    host: config.listen.host,
    port: config.listen.port,
    ...(config.listen.allowedHosts ? { allowedHosts: config.listen.allowedHosts } : {}),
    bodyStallMs: config.listen.bodyStallSeconds * 1000,
    responseStallMs: config.listen.responseStallSeconds * 1000,
    ...(config.controlToken ? { controlToken: config.controlToken } : {}),
    ...(config.apiKey ? { apiKey: config.apiKey } : {}),
    ...(ram ? { ram } : {}),
    ...(config.codec !== 'off' ? { codec: config.codec } : {}),
    supervisor,
    budgets: budgetsOf(config),
    readiness,
    ...(config.publicStatus !== undefined ? { publicStatus: config.publicStatus } : {}),
    log,
  });
  teardown.add('the agent', async () => {
    const stopping = controller.close(); // first: requests still waiting for an engine are answered (E_CLOSED) at once
    await agent.close({ graceMs });
    await stopping;
  });
  const closing = new AbortController();
  teardown.add('the boot', () => closing.abort(new VsnapError('E_ABORTED', 'vsnap serve is stopping')));
  booted = bootEngines({ config, store, clients, sources, needsPull, started, supervisor, controller, readiness, ram, signal: closing.signal, log, stallLogMs: options.pullStallLogMs ?? 30_000 });
  booted.catch(() => undefined); // the caller learns of it through `booted`; never an unhandled rejection
  return { agent, controller, supervisor, readiness, booted, close: () => teardown.run() };
}

/** Stops the engines a serve that died left behind (they hold their ports and GPU memory): before the port check. */
async function stopLeftovers(config: ServeConfig, options: ServeOptions, log: (line: string) => void, graceMs: number): Promise<EngineRecord> {
  const record = EngineRecord.forServe(config.store, config.listen, options.stateDir);
  const leftovers = await record.stopLeftovers(graceMs);
  if (leftovers.ownerRunning !== undefined) {
    log(`vsnap: another vsnap serve (pid ${leftovers.ownerRunning}) runs with this store and listen address: its engines are left alone, and this one keeps no record of its own`);
  }
  if (record.problem) log(`vsnap: no record of the engines this serve starts (${record.problem}): if it is killed, a restart cannot stop what it leaves (set XDG_STATE_HOME or ServeOptions.stateDir)`);
  for (const l of leftovers.stopped) {
    log(`vsnap: stopped engine '${l.name}' (pid ${l.pid}, ${l.processes} process(es)${l.killed ? ', SIGKILL after the grace period' : ''}), left running by a vsnap serve that died`);
  }
  return record;
}

/** Listening on every address with no API key opens the engines to whoever reaches the port: said, not refused. */
function warnOpenListen(config: ServeConfig, log: (line: string) => void): void {
  const host = config.listen.host;
  if (config.apiKey || !(host === '0.0.0.0' || host === '::' || host === '')) return;
  log(`vsnap: warning: listening on every address (${host || 'all'}) with no apiKey: anyone who reaches port ${config.listen.port} can use the models; set apiKey, or listen on 127.0.0.1 behind a proxy that checks clients`);
}

function engineUrl(config: ServeConfig, name: string): string {
  const m = config.models[name]!;
  return m.url ?? `http://127.0.0.1:${m.port}`;
}

function engineClients(config: ServeConfig): Map<string, EngineClient> {
  const clients = new Map<string, EngineClient>();
  for (const [name, m] of Object.entries(config.models)) {
    clients.set(name, new EngineClient({ baseUrl: engineUrl(config, name), ...(m.token ? { token: m.token } : {}), ...(m.apiKey ? { apiKey: m.apiKey } : {}) }));
  }
  return clients;
}

/** Models with a registry source (CA and credentials from the environment): read before anything starts. */
function registrySources(config: ServeConfig, log: (line: string) => void): Map<string, RegistrySource> {
  const sources = new Map<string, RegistrySource>();
  const models = Object.entries(config.models).filter(([, m]) => m.registry);
  if (models.length === 0) return sources;
  const registry = new RegistryClient(registryOptionsFromEnv());
  for (const [name, m] of models) sources.set(name, { reference: m.registry!, registry, onProgress: progressLog(log, name) });
  return sources;
}

/** The supervisor of the engines vsnap starts, its events written to the engine record, the readiness board and the log. */
function superviseEngines(
  config: ServeConfig,
  started: readonly string[],
  p: { record: EngineRecord; readiness: ModelReadinessBoard; log: (line: string) => void; graceMs: number; options: ServeOptions },
): Supervisor {
  const { record, readiness, log } = p;
  const supervisor = new Supervisor(
    started.map((name) => {
      const m = config.models[name]!;
      return {
        name,
        command: m.command!,
        args: m.args.map((a) => a.replaceAll('${PORT}', String(m.port))),
        env: { ...m.env, ...(m.token ? { VSNAP_TOKEN: m.token } : {}) },
        url: engineUrl(config, name),
        healthPath: m.healthPath,
      };
    }),
    {
      healthTimeoutMs: config.startup.healthTimeoutSeconds * 1000,
      graceMs: p.graceMs,
      log: (name, line) => log(`[${name}] ${line}`),
      ...(p.options.parentDeathSignal !== undefined ? { parentDeathSignal: p.options.parentDeathSignal } : {}),
    },
  );
  supervisor.on('spawn', (e: { name: string; pid: number }) => {
    record.started(e.name, e.pid);
    log(`vsnap: ${e.name}: engine process ${e.pid} started`);
    if (readiness.get(e.name)?.phase === 'waiting') readiness.set(e.name, 'starting', `its engine (pid ${e.pid}) is starting: waiting for ${engineUrl(config, e.name)}${config.models[e.name]!.healthPath} to answer`);
  });
  supervisor.on('exit', (e: { pid?: number }) => {
    if (e.pid !== undefined) record.exited(e.pid);
  });
  if (started.length > 0 && supervisor.parentDeath === 'unavailable') {
    log('vsnap: neither setpriv (util-linux) nor python3 is installed: engines will outlive a vsnap serve that is killed (the next start stops them)');
  }
  for (const name of started) readiness.set(name, 'waiting', 'waiting for its turn to start (engines start one at a time)');
  return supervisor;
}

function logControllerEvents(controller: SwapController, log: (line: string) => void): void {
  controller.on('swap', (e: SwapEvent) => log(`vsnap: ${e.action} ${e.engine} in ${(e.seconds * 1000).toFixed(0)} ms${e.tier ? ` (from ${e.tier})` : ''}`));
  controller.on('swapFailed', (e: { engine: string; action: string; error: Error }) => log(`vsnap: ${e.action} of ${e.engine} failed: ${e.error.message}`));
  controller.on('snapshotDamaged', (e: { engine: string; reason: string; detail?: string }) => log(`vsnap: the snapshot of ${e.engine} is damaged: ${e.reason}${e.detail ? ` (${e.detail})` : ''}; re-capture it, or repair it and verify it`));
  controller.on('recovered', (e: { engine: string; reason: string; code: string; seconds: number }) =>
    log(`vsnap: ${e.engine} recovered through its engine's own loader in ${(e.seconds * 1000).toFixed(0)} ms: its snapshot could not be used (${e.reason}, ${e.code})`),
  );
  controller.on('materializeFailed', (e: { engine: string; error: Error }) => log(`vsnap: capturing a new snapshot of ${e.engine} after its recovery failed: ${e.error.message}`));
  controller.on('parked', (e: { engine: string; device: number; bytes: number; seconds: number }) =>
    log(`vsnap: parked ${e.engine}'s weights on gpu ${e.device} (${(e.bytes / GiB).toFixed(1)} GiB in ${(e.seconds * 1000).toFixed(0)} ms)`),
  );
  controller.on('neighbourEvicted', (e: { engine?: string; reason: string; for?: string }) =>
    log(`vsnap: evicted ${e.engine ?? 'a'} parked copy from the neighbour tier (${e.reason}${e.for ? `, for ${e.for}` : ''})`),
  );
}
