import type { IncomingMessage, ServerResponse } from 'node:http';

import type { RamTier } from '../../cache/ram-tier.js';
import type { RegionStore } from '../../store/region-store.js';
import type { EngineView, SwapController, SwapEvent, SwapFailedEvent } from '../../swap/controller.js';
import type { NeighbourView } from '../../swap/neighbour-parking.js';
import type { ModelReadiness, ModelReadinessSource } from '../model-readiness.js';
import type { EngineProcessState, Supervisor } from '../supervisor.js';

/** A finished or failed swap, as the status page charts it. @internal */
export interface SwapRecord {
  readonly at: number;
  readonly engine: string;
  readonly action: 'suspend' | 'restore' | 'demote';
  readonly ok: boolean;
  readonly seconds?: number;
  readonly phases?: Readonly<Record<string, number>>;
  readonly tier?: string;
  /** A restore that went through the engine's own loader: why its snapshot could not be used. */
  readonly recovered?: string;
  readonly error?: string;
}

/** What the status page shows: one JSON document (`GET /api/status`, and each `/api/events` event). @internal */
export interface StatusReport {
  readonly at: number;
  readonly health: Health;
  readonly engines: Array<EngineView & { devices: readonly number[]; memoryBytes: number; asleepBytes: number; process?: EngineProcessState; readiness?: ModelReadiness }>;
  readonly gpus: Array<{ device: number; budgetBytes: number | null; awakeBytes: number; heldBytes: number; usedBytes: number }>;
  readonly ramTier: { budgetBytes: number; usedBytes: number; entries: Array<{ name: string; id: string; bytes: number; durable: boolean }> } | null;
  /** The neighbour-GPU tier (null when none is configured). */
  readonly neighbourTier: NeighbourView | null;
  /** The store's snapshots; `damaged: true` with a `reason` when one cannot bring its engine back. */
  readonly snapshots: Array<Record<string, unknown>>;
  readonly snapshotsError?: string;
  readonly queue: { waiting: number; leases: number };
  readonly swaps: SwapRecord[];
}

/** `/healthz`: ok, or degraded with the engines that failed or whose process is down. @internal */
export interface Health {
  readonly ok: boolean;
  readonly status: 'ok' | 'degraded';
  readonly degraded?: Array<{ engine: string; reason: string }>;
}

const KEEP_SWAPS = 60;

/** Collects what the status page shows and pushes it to its live streams. @internal */
export class StatusBoard {
  private readonly swaps: SwapRecord[] = [];
  private readonly streams = new Set<ServerResponse>();
  private pending: NodeJS.Timeout | undefined;
  private readonly onSwap = (e: SwapEvent): void =>
    this.record({ at: Date.now(), engine: e.engine, action: e.action, ok: true, seconds: e.seconds, ...(e.phases ? { phases: e.phases } : {}), ...(e.tier ? { tier: e.tier } : {}), ...(e.recovered ? { recovered: e.recovered } : {}) });
  private readonly onFailed = (e: SwapFailedEvent): void =>
    this.record({ at: Date.now(), engine: e.engine, action: e.action, ok: false, error: e.error.message });
  private readonly onChange = (): void => this.push();
  private readonly onReadiness = (): void => this.push();

  constructor(
    private readonly source: {
      readonly controller: SwapController;
      readonly store: RegionStore;
      readonly ram?: RamTier;
      readonly supervisor?: Supervisor;
      readonly budgets?: Readonly<Record<number, number>>;
      readonly readiness?: ModelReadinessSource;
    },
  ) {
    source.readiness?.on?.('change', this.onReadiness);
    source.controller.on('swap', this.onSwap);
    source.controller.on('swapFailed', this.onFailed);
    source.controller.on('change', this.onChange);
  }

  private record(r: SwapRecord): void {
    this.swaps.push(r);
    if (this.swaps.length > KEEP_SWAPS) this.swaps.shift();
    this.push();
  }

  health(): Health {
    const degraded: Array<{ engine: string; reason: string }> = [];
    // A model not ready yet (booting, pulling) or whose boot failed: its reason says it all.
    for (const r of this.source.readiness?.views() ?? []) {
      if (!r.ready) degraded.push({ engine: r.name, reason: `not ready (${r.phase}): ${r.reason ?? r.phase}` });
    }
    for (const v of this.source.controller.states()) {
      if (degraded.some((d) => d.engine === v.name)) continue;
      if (v.state === 'failed') degraded.push({ engine: v.name, reason: v.error ?? 'failed' });
    }
    for (const p of this.source.supervisor?.states() ?? []) {
      if (p.status !== 'running' && !degraded.some((d) => d.engine === p.name)) degraded.push({ engine: p.name, reason: `process ${p.status}` });
    }
    return degraded.length ? { ok: false, status: 'degraded', degraded } : { ok: true, status: 'ok' };
  }

  async snapshot(): Promise<StatusReport> {
    const { controller, store, ram, supervisor, budgets } = this.source;
    const processes = new Map((supervisor?.states() ?? []).map((p) => [p.name, p]));
    const engines = controller.states().map((v) => {
      const spec = controller.engine(v.name);
      const p = processes.get(v.name);
      const r = this.source.readiness?.get(v.name);
      return { ...v, memoryBytes: spec.memoryBytes, asleepBytes: spec.asleepBytes ?? 0, ...(p ? { process: p } : {}), ...(r ? { readiness: r } : {}) };
    });
    const usage = controller.usage();
    const gpus = Object.keys({ ...usage, ...(budgets ?? {}) }).map(Number).sort((a, b) => a - b).map((device) => {
      const awakeBytes = engines.filter((e) => e.devices.includes(device) && e.state !== 'asleep' && e.state !== 'failed').reduce((n, e) => n + e.memoryBytes, 0);
      const usedBytes = usage[device] ?? 0;
      return { device, budgetBytes: budgets?.[device] ?? null, awakeBytes, heldBytes: Math.max(0, usedBytes - awakeBytes), usedBytes };
    });
    let snapshots: Array<Record<string, unknown>> = [];
    let snapshotsError: string | undefined;
    try {
      // A snapshot an engine cannot be restored from (a failed restore, missing blobs) is shown
      // damaged, with the controller's reason; so is a name whose manifest the store cannot read.
      const damaged = new Map<string, string>();
      for (const e of engines) if (e.snapshotProblem) damaged.set(controller.engine(e.name).snapshot ?? e.name, e.snapshotProblem);
      const list = await store.list();
      snapshots = list.map((s) => ({ ...s, ...(damaged.has(s.name) ? { damaged: true, reason: damaged.get(s.name) } : {}) }));
      for (const p of list.problems) snapshots.push({ name: p.name, damaged: true, reason: `${p.code}: ${p.message}` });
    } catch (err) {
      snapshotsError = (err as Error).message;
    }
    return {
      at: Date.now(),
      health: this.health(),
      engines,
      gpus,
      ramTier: ram
        ? { budgetBytes: ram.budgetBytes, usedBytes: ram.usedBytes, entries: ram.entries.map((e) => ({ name: e.name, id: e.id, bytes: e.bytes, durable: e.durable })) }
        : null,
      neighbourTier: controller.neighbour() ?? null,
      snapshots,
      ...(snapshotsError ? { snapshotsError } : {}),
      queue: { waiting: engines.reduce((n, e) => n + e.waiting, 0), leases: engines.reduce((n, e) => n + e.leases, 0) },
      swaps: [...this.swaps],
    };
  }

  /** Server-sent events: the report now, then after every change (at most ~5 a second), with a comment every 15 s. */
  stream(req: IncomingMessage, res: ServerResponse): void {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store', connection: 'keep-alive' });
    this.streams.add(res);
    const beat = setInterval(() => res.write(': ping\n\n'), 15_000);
    beat.unref();
    const gone = (): void => {
      clearInterval(beat);
      this.streams.delete(res);
    };
    req.once('close', gone);
    res.once('close', gone);
    void this.sendTo([res]);
  }

  private push(): void {
    if (this.pending || this.streams.size === 0) return;
    this.pending = setTimeout(() => {
      this.pending = undefined;
      void this.sendTo([...this.streams]);
    }, 200);
    this.pending.unref();
  }

  private async sendTo(targets: ServerResponse[]): Promise<void> {
    let text: string;
    try {
      text = `event: status\ndata: ${JSON.stringify(await this.snapshot())}\n\n`;
    } catch (err) {
      text = `event: problem\ndata: ${JSON.stringify({ message: (err as Error).message })}\n\n`;
    }
    for (const res of targets) if (!res.writableEnded && !res.destroyed) res.write(text);
  }

  /** Ends every stream and stops listening to the controller. */
  close(): void {
    clearTimeout(this.pending);
    this.source.controller.off('swap', this.onSwap);
    this.source.controller.off('swapFailed', this.onFailed);
    this.source.controller.off('change', this.onChange);
    this.source.readiness?.off?.('change', this.onReadiness);
    for (const res of this.streams) res.end();
    this.streams.clear();
  }
}
