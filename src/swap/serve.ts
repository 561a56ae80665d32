import { HostCache } from '../cache/host-cache.js';
import { EngineClient } from '../engine/engine-client.js';
import { toVsnapError } from '../errors.js';
import { Registry } from '../registry/registry.js';
import { pullIfMissing, registryOptionsFromEnv, type RegistrySource } from '../registry/source.js';
import { suspendEngine } from '../flows/index.js';
import { RegionStore } from '../store/region-store.js';
import { SwapAgent } from './agent.js';
import { checkPorts, type ServeConfig } from './config.js';
import { SwapController, type SwapEvent } from './controller.js';
import { Supervisor } from './supervisor.js';

const GiB = 2 ** 30;

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
  /** Stops the agent, the controller and every engine vsnap started. */
  close(): Promise<void>;
}

/**
 * Runs a configuration: starts the engines that have a command (one at a time; each is captured
 * if no snapshot matches it, then suspended, so N engines boot warm with none resident), then the
 * SwapController (which wakes the pinned engines and the default model) and the HTTP agent. A
 * listen or engine port already in use is refused (`E_ADDRESS_IN_USE`) before any engine boots.
 * @public
 */
export async function serve(config: ServeConfig, options: { log?: (line: string) => void } = {}): Promise<ServeHandle> {
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  await checkPorts(config);
  // Models with a registry source (CA and credentials from the environment): read before anything starts.
  const registry = Object.values(config.models).some((m) => m.registry) ? new Registry(registryOptionsFromEnv()) : undefined;
  const store = await RegionStore.open(config.store);
  const clients = new Map<string, EngineClient>();
  const url = (name: string): string => {
    const m = config.models[name]!;
    return m.url ?? `http://127.0.0.1:${m.port}`;
  };
  for (const [name, m] of Object.entries(config.models)) {
    clients.set(name, new EngineClient({ baseUrl: url(name), ...(m.token ? { token: m.token } : {}), ...(m.apiKey ? { apiKey: m.apiKey } : {}) }));
  }
  const supervisor = new Supervisor(
    Object.entries(config.models)
      .filter(([, m]) => m.command)
      .map(([name, m]) => ({
        name,
        command: m.command!,
        args: m.args.map((a) => a.replaceAll('${PORT}', String(m.port))),
        env: { ...m.env, ...(m.token ? { VSNAP_TOKEN: m.token } : {}) },
        url: url(name),
        healthPath: m.healthPath,
      })),
    { healthTimeoutMs: config.startup.healthTimeoutSeconds * 1000, graceMs: config.startup.graceSeconds * 1000, log: (name, line) => log(`[${name}] ${line}`) },
  );
  // Their snapshot is pulled when the store lacks it, at start-up (a failure is logged: the first
  // restore pulls again, or recovers), then it is local.
  const sources = new Map<string, RegistrySource>();
  for (const [name, m] of Object.entries(config.models)) {
    if (m.registry) sources.set(name, { reference: m.registry, registry: registry!, onProgress: progressLog(log, name) });
  }
  const pullMissing = async (name: string): Promise<void> => {
    const from = sources.get(name);
    if (!from) return;
    const snapshot = config.models[name]!.snapshot ?? name;
    try {
      const r = await pullIfMissing({ store, name: snapshot, from }, clients.get(name)!, {});
      if (r) log(`vsnap: ${name}: pulled snapshot '${snapshot}' from ${from.reference} (${(r.bytesDownloaded / 2 ** 20).toFixed(1)} MiB downloaded in ${r.seconds.toFixed(1)} s)`);
    } catch (err) {
      const e = toVsnapError(err);
      log(`vsnap: ${name}: pulling snapshot '${snapshot}' from ${from.reference} failed (${e.code}): ${e.message}`);
    }
  };
  let controller: SwapController | undefined;
  const cache = config.ramTierGiB > 0 ? await HostCache.create({ budgetBytes: Math.floor(config.ramTierGiB * GiB) }) : undefined;
  try {
    await supervisor.start({
      onReady: async (name) => {
        const m = config.models[name]!;
        await pullMissing(name); // before the capture-if-needed below, which a pulled snapshot spares
        // The boot-time capture lands in the RAM tier too (one pass), so the first wake is a bulk copy from RAM.
        const capture = { ...(cache ? { cache } : {}), ...(m.check ? { check: m.check } : {}) };
        const r = await suspendEngine(store, m.snapshot ?? name, clients.get(name)!, { captureIfNeeded: true, capture });
        log(`vsnap: ${name} is up and suspended${r.captured ? ' (snapshot captured)' : ''} in ${r.seconds.toFixed(1)} s`);
      },
      onRestart: async (name) => {
        log(`vsnap: ${name} was restarted`);
        await controller?.resync(name);
      },
    });
    for (const [name, m] of Object.entries(config.models)) if (!m.command) await pullMissing(name); // engines already running
    controller = await SwapController.create({
      store,
      engines: Object.entries(config.models).map(([name, m]) => ({
        name,
        client: clients.get(name)!,
        snapshot: m.snapshot ?? name,
        ...(sources.has(name) ? { from: sources.get(name)! } : {}),
        devices: m.gpus,
        memoryBytes: Math.floor(m.memoryGiB * GiB),
        asleepBytes: Math.floor(m.asleepGiB * GiB),
        pinned: m.pinned,
        ...(m.deepSuspend ? { deepSuspend: true } : {}),
        ...(m.check ? { check: m.check } : {}),
        ...(m.ttlSeconds !== undefined ? { idleTtlMs: m.ttlSeconds * 1000 } : {}),
        ...(m.group ? { group: m.group } : {}),
      })),
      budgets: Object.fromEntries(Object.entries(config.gpus).map(([d, g]) => [Number(d), Math.floor(g.budgetGiB * GiB)])),
      tiers: {
        ...(cache ? { ram: cache } : {}),
        ...(config.neighbourTier ? { neighbour: { device: config.neighbourTier.gpu, budgetBytes: Math.floor(config.neighbourTier.budgetGiB * GiB) } } : {}),
        ...(config.multipath ? { multipath: { neighbour: config.multipath.gpu } } : {}),
      },
      recovery: { policy: config.recovery.mode, materialize: config.recovery.materialize },
      ...(config.defaultModel ? { defaultModel: config.defaultModel } : {}),
      queue: { limit: config.queue.limit, timeoutMs: config.queue.timeoutSeconds * 1000 },
    });
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
    const agent = await SwapAgent.listen({
      controller,
      store,
      host: config.listen.host,
      port: config.listen.port,
      ...(config.controlToken ? { controlToken: config.controlToken } : {}),
      ...(config.apiKey ? { apiKey: config.apiKey } : {}),
      ...(cache ? { cache } : {}),
      supervisor,
      budgets: Object.fromEntries(Object.entries(config.gpus).map(([d, g]) => [Number(d), Math.floor(g.budgetGiB * GiB)])),
      ...(config.publicStatus !== undefined ? { publicStatus: config.publicStatus } : {}),
      log,
    });
    const ctl = controller;
    return {
      agent,
      controller: ctl,
      supervisor,
      async close() {
        await agent.close();
        await ctl.close();
        await supervisor.stop();
        for (const c of clients.values()) await c.close();
        cache?.close();
      },
    };
  } catch (err) {
    await controller?.close();
    await supervisor.stop();
    for (const c of clients.values()) await c.close();
    cache?.close();
    throw err;
  }
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
