import type { RamTier } from '../cache/ram-tier.js';
import type { EngineClient } from '../engine/engine-client.js';
import { toVsnapError } from '../errors.js';
import { suspendEngine } from '../flows/index.js';
import { pullIfMissing, type RegistrySource } from '../registry/source.js';
import type { RegistryProgress } from '../registry/types.js';
import type { RegionStore } from '../store/region-store.js';
import type { SwapController } from '../swap/controller.js';
import type { ServeConfig } from './config.js';
import type { ModelReadinessBoard } from './model-readiness.js';
import type { Supervisor } from './supervisor.js';

/** What the boot of `vsnap serve` works with (made by serve()). @internal */
export interface BootParts {
  readonly config: ServeConfig;
  readonly store: RegionStore;
  readonly clients: ReadonlyMap<string, EngineClient>;
  readonly sources: ReadonlyMap<string, RegistrySource>;
  /** Models whose snapshot the store lacks and that have a registry source. */
  readonly needsPull: ReadonlySet<string>;
  /** The models whose engine vsnap starts, in boot order. */
  readonly started: readonly string[];
  readonly supervisor: Supervisor;
  readonly controller: SwapController;
  readonly readiness: ModelReadinessBoard;
  readonly ram: RamTier | undefined;
  /** Aborted when serve stops. */
  readonly signal: AbortSignal;
  readonly log: (line: string) => void;
  /** A pull that has made no progress for this long is logged. */
  readonly stallLogMs: number;
}

/**
 * Boots the engines: those vsnap starts, one at a time (each pulled if its snapshot is missing,
 * captured if none matches, then suspended), and, in parallel, the pulls of engines already
 * running. Rejects with the error of an engine that could not be booted, after marking the
 * models left not ready with the reason.
 * @internal
 */
export async function bootEngines(p: BootParts): Promise<void> {
  const { config, readiness, log } = p;
  const release = async (name: string): Promise<void> => {
    try {
      await p.controller.releaseBootHold(name);
    } catch (err) {
      log(`vsnap: ${name}: ${(err as Error).message}`);
    }
  };
  // Engines already running with a snapshot to pull: in parallel with the boot (they load nothing).
  const prefetches = [...p.needsPull]
    .filter((n) => !config.models[n]!.command)
    .map(async (name) => {
      await pullMissing(p, name);
      readiness.ready(name);
      log(`vsnap: ${name} is ready`);
    });
  let current: string | undefined;
  try {
    await p.supervisor.start({
      onReady: async (name) => {
        current = name;
        const m = config.models[name]!;
        const preparing = 'its engine is up: suspending it (captured first if no snapshot matches)';
        readiness.set(name, p.needsPull.has(name) ? 'pulling' : 'preparing', p.needsPull.has(name) ? `pulling its snapshot from ${p.sources.get(name)!.reference}` : preparing);
        await pullMissing(p, name); // before the capture-if-needed below, which a pulled snapshot spares
        readiness.set(name, 'preparing', preparing);
        // The boot-time capture lands in the RAM tier too (one pass), so the first wake is a bulk copy from RAM.
        const capture = { ...(p.ram ? { ram: p.ram } : {}), ...(m.check ? { check: m.check } : {}), ...(config.codec !== 'off' ? { codec: config.codec } : {}) };
        const r = await suspendEngine(p.store, m.snapshot ?? name, p.clients.get(name)!, { captureIfNeeded: true, capture, signal: p.signal });
        log(`vsnap: ${name} is up and suspended${r.captured ? ' (snapshot captured)' : ''} in ${r.seconds.toFixed(1)} s`);
        readiness.ready(name);
        await release(name);
        current = undefined;
      },
      onRestart: async (name) => {
        log(`vsnap: ${name} was restarted`);
        if (readiness.get(name)?.ready) await p.controller.resync(name);
      },
    });
  } catch (err) {
    const e = toVsnapError(err);
    if (!p.signal.aborted) {
      const failed = current ?? p.started.find((n) => !readiness.get(n)?.ready);
      for (const name of p.started) {
        if (readiness.get(name)?.ready) continue;
        readiness.set(name, 'failed', name === failed ? `its boot failed (${e.code}): ${e.message}` : `not started: the boot stopped at '${failed}' (${e.code})`);
        await release(name);
      }
    }
    await Promise.allSettled(prefetches);
    throw e;
  }
  await Promise.all(prefetches);
}

/** Pulls a model's snapshot when the store lacks it, reporting progress (and stalls) in its readiness and the log. A failure is logged: it is then captured or recovered as when it is missing. */
async function pullMissing(p: BootParts, name: string): Promise<void> {
  const from = p.sources.get(name);
  if (!from) return;
  const snapshot = p.config.models[name]!.snapshot ?? name;
  if (await p.store.current(snapshot)) return;
  const watch = pullWatch(name, from.reference, p.readiness, p.log, p.stallLogMs);
  p.log(`vsnap: ${name}: pulling snapshot '${snapshot}' from ${from.reference}`);
  try {
    const r = await pullIfMissing({ store: p.store, name: snapshot, from: { ...from, onProgress: (q) => (from.onProgress?.(q), watch.progress(q)) } }, p.clients.get(name)!, { signal: p.signal });
    if (r) p.log(`vsnap: ${name}: pulled snapshot '${snapshot}' from ${from.reference} (${(r.bytesDownloaded / 2 ** 20).toFixed(1)} MiB downloaded in ${r.seconds.toFixed(1)} s)`);
  } catch (err) {
    if (p.signal.aborted) throw err;
    const e = toVsnapError(err);
    p.log(`vsnap: ${name}: pulling snapshot '${snapshot}' from ${from.reference} failed (${e.code}): ${e.message}`);
  } finally {
    watch.stop();
  }
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

/** Logs a pull's phases and every quarter of its download. @internal */
export function progressLog(log: (line: string) => void, name: string): (p: { phase: string; bytesDone: number; bytesTotal: number }) => void {
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
