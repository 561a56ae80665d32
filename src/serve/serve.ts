import { HostCache } from '../cache/host-cache.js';
import { EngineClient } from '../engine/engine-client.js';
import { toVsnapError, VsnapError } from '../errors.js';
import { RegistryClient } from '../registry/registry.js';
import { pullIfMissing, registryOptionsFromEnv, type RegistrySource } from '../registry/source.js';
import type { RegistryProgress } from '../registry/types.js';
import { suspendEngine } from '../flows/index.js';
import { RegionStore } from '../store/region-store.js';
import { SwapAgent } from './agent.js';
import { checkPorts, type ServeConfig } from './config.js';
import { SwapController, type SwapEvent } from '../swap/controller.js';
import { EngineRecord } from './engine-record.js';
import { ModelReadinessBoard, type ModelReadinessSource } from './model-readiness.js';
import { checkCommand, Supervisor, type SupervisorOptions } from './supervisor.js';
import { budgetsOf, bytesOf, controllerOptionsOf } from './controller-options.js';

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
  readonly controller: SwapController;
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
  /** Stops the agent, the boot if it still runs, the controller and every engine vsnap started. */
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
  const graceMs = config.startup.graceSeconds * 1000;
  // Engines a serve that died left behind hold their ports and GPU memory: stopped before the port check.
  const record = EngineRecord.forServe(config.store, config.listen, options.stateDir);
  const leftovers = await record.stopLeftovers(graceMs);
  if (leftovers.ownerRunning !== undefined) {
    log(`vsnap: another vsnap serve (pid ${leftovers.ownerRunning}) runs with this store and listen address: its engines are left alone, and this one keeps no record of its own`);
  }
  if (record.problem) log(`vsnap: no record of the engines this serve starts (${record.problem}): if it is killed, a restart cannot stop what it leaves (set XDG_STATE_HOME or ServeOptions.stateDir)`);
  for (const l of leftovers.stopped) {
    log(`vsnap: stopped engine '${l.name}' (pid ${l.pid}, ${l.processes} process(es)${l.killed ? ', SIGKILL after the grace period' : ''}), left running by a vsnap serve that died`);
  }
  await checkPorts(config);
  // an engine command that is not there is a mistake in the configuration: said before anything starts
  for (const [name, m] of Object.entries(config.models)) if (m.command) checkCommand({ name, command: m.command, env: m.env });
  // Models with a registry source (CA and credentials from the environment): read before anything starts.
  const registry = Object.values(config.models).some((m) => m.registry) ? new RegistryClient(registryOptionsFromEnv()) : undefined;
  const store = await RegionStore.open(config.store);
  const names = Object.keys(config.models);
  const clients = new Map<string, EngineClient>();
  const url = (name: string): string => {
    const m = config.models[name]!;
    return m.url ?? `http://127.0.0.1:${m.port}`;
  };
  for (const [name, m] of Object.entries(config.models)) {
    clients.set(name, new EngineClient({ baseUrl: url(name), ...(m.token ? { token: m.token } : {}), ...(m.apiKey ? { apiKey: m.apiKey } : {}) }));
  }
  const readiness = new ModelReadinessBoard(names);
  const closing = new AbortController();
  const stallLogMs = options.pullStallLogMs ?? 30_000;
  const sources = new Map<string, RegistrySource>();
  for (const [name, m] of Object.entries(config.models)) {
    if (m.registry) sources.set(name, { reference: m.registry, registry: registry!, onProgress: progressLog(log, name) });
  }
  // Which models need a pull (a registry source, and the store lacks the snapshot): their engines boot last.
  const needsPull = new Set<string>();
  for (const name of sources.keys()) if (!(await store.current(config.models[name]!.snapshot ?? name))) needsPull.add(name);
  const started = Object.entries(config.models)
    .filter(([, m]) => m.command)
    .sort(([a], [b]) => Number(needsPull.has(a)) - Number(needsPull.has(b)));
  const supervisor = new Supervisor(
    started.map(([name, m]) => ({
      name,
      command: m.command!,
      args: m.args.map((a) => a.replaceAll('${PORT}', String(m.port))),
      env: { ...m.env, ...(m.token ? { VSNAP_TOKEN: m.token } : {}) },
      url: url(name),
      healthPath: m.healthPath,
    })),
    {
      healthTimeoutMs: config.startup.healthTimeoutSeconds * 1000,
      graceMs,
      log: (name, line) => log(`[${name}] ${line}`),
      ...(options.parentDeathSignal !== undefined ? { parentDeathSignal: options.parentDeathSignal } : {}),
    },
  );
  supervisor.on('spawn', (e: { name: string; pid: number }) => {
    record.started(e.name, e.pid);
    log(`vsnap: ${e.name}: engine process ${e.pid} started`);
    if (readiness.get(e.name)?.phase === 'waiting') readiness.set(e.name, 'starting', `its engine (pid ${e.pid}) is starting: waiting for ${url(e.name)}${config.models[e.name]!.healthPath} to answer`);
  });
  supervisor.on('exit', (e: { pid?: number }) => {
    if (e.pid !== undefined) record.exited(e.pid);
  });
  if (started.length > 0 && supervisor.parentDeath === 'unavailable') {
    log('vsnap: neither setpriv (util-linux) nor python3 is installed: engines will outlive a vsnap serve that is killed (the next start stops them)');
  }
  for (const [name] of started) readiness.set(name, 'waiting', 'waiting for its turn to start (engines start one at a time)');
  for (const name of needsPull) if (!config.models[name]!.command) readiness.set(name, 'pulling', `pulling its snapshot from ${sources.get(name)!.reference}`);

  /** Pulls a model's snapshot when the store lacks it, reporting progress (and stalls) in its readiness and the log. A failure is logged: it is then captured or recovered as when it is missing. */
  const pullMissing = async (name: string): Promise<void> => {
    const from = sources.get(name);
    if (!from) return;
    const snapshot = config.models[name]!.snapshot ?? name;
    if (await store.current(snapshot)) return;
    const watch = pullWatch(name, from.reference, readiness, log, stallLogMs);
    log(`vsnap: ${name}: pulling snapshot '${snapshot}' from ${from.reference}`);
    try {
      const r = await pullIfMissing({ store, name: snapshot, from: { ...from, onProgress: (p) => (from.onProgress?.(p), watch.progress(p)) } }, clients.get(name)!, { signal: closing.signal });
      if (r) log(`vsnap: ${name}: pulled snapshot '${snapshot}' from ${from.reference} (${(r.bytesDownloaded / 2 ** 20).toFixed(1)} MiB downloaded in ${r.seconds.toFixed(1)} s)`);
    } catch (err) {
      if (closing.signal.aborted) throw err;
      const e = toVsnapError(err);
      log(`vsnap: ${name}: pulling snapshot '${snapshot}' from ${from.reference} failed (${e.code}): ${e.message}`);
    } finally {
      watch.stop();
    }
  };
  const cache = config.ramTierGiB > 0 ? await HostCache.create({ budgetBytes: bytesOf(config.ramTierGiB) }) : undefined;
  const budgets = budgetsOf(config);
  let controller: SwapController | undefined;
  let agent: SwapAgent | undefined;
  const cleanUp = async (): Promise<void> => {
    closing.abort(new VsnapError('E_ABORTED', 'vsnap serve is stopping'));
    await controller?.close();
    await supervisor.stop();
    for (const c of clients.values()) await c.close();
    cache?.close();
    record.remove();
  };
  try {
    controller = await SwapController.create(controllerOptionsOf(config, { store, clients, sources, cache, booting: started.map(([name]) => name) }));
    logControllerEvents(controller, log);
    agent = await SwapAgent.listen({
      controller,
      store,
      host: config.listen.host,
      port: config.listen.port,
      ...(config.listen.allowedHosts ? { allowedHosts: config.listen.allowedHosts } : {}),
      ...(config.controlToken ? { controlToken: config.controlToken } : {}),
      ...(config.apiKey ? { apiKey: config.apiKey } : {}),
      ...(cache ? { cache } : {}),
      supervisor,
      budgets,
      readiness,
      ...(config.publicStatus !== undefined ? { publicStatus: config.publicStatus } : {}),
      log,
    });
  } catch (err) {
    await cleanUp();
    throw err;
  }
  const ctl = controller;
  const release = async (name: string): Promise<void> => {
    try {
      await ctl.releaseBootHold(name);
    } catch (err) {
      log(`vsnap: ${name}: ${(err as Error).message}`);
    }
  };

  /** Engines already running with a snapshot to pull: in parallel with the boot (they load nothing). */
  const prefetch = async (name: string): Promise<void> => {
    await pullMissing(name);
    readiness.ready(name);
    log(`vsnap: ${name} is ready`);
  };
  const boot = async (): Promise<void> => {
    const prefetches = [...needsPull].filter((n) => !config.models[n]!.command).map((n) => prefetch(n));
    let current: string | undefined;
    try {
      await supervisor.start({
        onReady: async (name) => {
          current = name;
          const m = config.models[name]!;
          readiness.set(name, needsPull.has(name) ? 'pulling' : 'preparing', needsPull.has(name) ? `pulling its snapshot from ${sources.get(name)!.reference}` : 'its engine is up: suspending it (captured first if no snapshot matches)');
          await pullMissing(name); // before the capture-if-needed below, which a pulled snapshot spares
          readiness.set(name, 'preparing', 'its engine is up: suspending it (captured first if no snapshot matches)');
          // The boot-time capture lands in the RAM tier too (one pass), so the first wake is a bulk copy from RAM.
          const capture = { ...(cache ? { cache } : {}), ...(m.check ? { check: m.check } : {}) };
          const r = await suspendEngine(store, m.snapshot ?? name, clients.get(name)!, { captureIfNeeded: true, capture, signal: closing.signal });
          log(`vsnap: ${name} is up and suspended${r.captured ? ' (snapshot captured)' : ''} in ${r.seconds.toFixed(1)} s`);
          readiness.ready(name);
          await release(name);
          current = undefined;
        },
        onRestart: async (name) => {
          log(`vsnap: ${name} was restarted`);
          if (readiness.get(name)?.ready) await ctl.resync(name);
        },
      });
    } catch (err) {
      const e = toVsnapError(err);
      if (!closing.signal.aborted) {
        const failed = current ?? started.find(([n]) => !readiness.get(n)?.ready)?.[0];
        for (const [name] of started) {
          if (readiness.get(name)?.ready) continue;
          readiness.set(name, 'failed', name === failed ? `its boot failed (${e.code}): ${e.message}` : `not started: the boot stopped at '${failed}' (${e.code})`);
          await release(name);
        }
      }
      await Promise.allSettled(prefetches);
      throw e;
    }
    await Promise.all(prefetches);
  };
  const booted = boot();
  booted.catch(() => undefined); // the caller learns of it through `booted`; never an unhandled rejection
  const handle: ServeHandle = {
    agent,
    controller: ctl,
    supervisor,
    readiness,
    booted,
    async close() {
      closing.abort(new VsnapError('E_ABORTED', 'vsnap serve is stopping'));
      const stopping = ctl.close(); // first: requests still waiting for an engine are answered (E_CLOSED) at once, so the agent's close does not wait on them
      await handle.agent.close();
      await stopping; // the swap in flight, if any, ends before the engines are stopped
      await supervisor.stop();
      await booted.catch(() => undefined);
      for (const c of clients.values()) await c.close();
      cache?.close();
      record.remove();
    },
  };
  return handle;
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

/**
 * Follows a pull for a model's readiness: where it stands (phase, MiB), and, when no byte moved
 * for `stallMs`, a log line and a reason that says so (again after each such period).
 */
function pullWatch(name: string, reference: string, readiness: ModelReadinessBoard, log: (line: string) => void, stallMs: number): { progress(p: RegistryProgress): void; stop(): void } {
  const MiB = 2 ** 20;
  let last = { phase: 'connecting', bytesDone: 0, bytesTotal: 0, lastProgressAt: Date.now() };
  const describe = (): string =>
    `pulling its snapshot from ${reference}: ${last.phase}${last.bytesTotal > 0 ? ` ${(last.bytesDone / MiB).toFixed(1)} of ${(last.bytesTotal / MiB).toFixed(1)} MiB` : ''}`;
  const timer = setInterval(() => {
    const idle = Date.now() - last.lastProgressAt;
    if (idle < stallMs) return;
    const why = `${describe()}; no progress for ${Math.round(idle / 1000)} s`;
    readiness.progress(name, why, last);
    log(`vsnap: ${name}: ${why}`);
  }, stallMs);
  timer.unref();
  return {
    progress(p) {
      last = { phase: p.phase, bytesDone: p.bytesDone, bytesTotal: p.bytesTotal, lastProgressAt: Date.now() };
      readiness.progress(name, describe(), last);
    },
    stop: () => clearInterval(timer),
  };
}

/** Logs a pull's phases and every quarter of its download. */
function progressLog(log: (line: string) => void, name: string): (p: { phase: string; bytesDone: number; bytesTotal: number }) => void {
  let phase = '';
  let quarter = 0;
  return (p) => {
    if (p.phase !== phase) {
      phase = p.phase;
      quarter = 0;
      if (p.phase !== 'done') log(`vsnap: ${name}: pull ${p.phase} (${(p.bytesTotal / 2 ** 20).toFixed(1)} MiB)`);
      return;
    }
    const q = p.bytesTotal > 0 ? Math.floor((4 * p.bytesDone) / p.bytesTotal) : 0;
    if (q > quarter && q < 4) {
      quarter = q;
      log(`vsnap: ${name}: pull ${p.phase} ${q * 25}%`);
    }
  };
}
