import { Counter, Gauge, type Registry } from 'prom-client';

import { NeighbourTier } from '../cache/neighbour-tier.js';
import type { NeighbourParkOptions, NeighbourParkResult } from '../cache/neighbour-tier.js';
import type { NeighbourEvictedEvent, SwapEmitter } from './events.js';
import { parkable, planPark, type PlanNeighbour } from './neighbour-plan.js';
import type { PlanInput } from './planner.js';
import type { NeighbourView, SwapNeighbourOptions } from './types.js';

export type { NeighbourView, SwapNeighbourOptions } from './types.js';

/** Why parked weights were evicted. @internal */
export type EvictReason = NeighbourEvictedEvent['reason'];

/**
 * The controller's side of the neighbour tier: who parked what, the park decisions (through the
 * pure planner), evictions, events (`parked`, `neighbourEvicted`) and metrics. Every call comes
 * from the executor's serial queue (close() after it drained).
 * @internal
 */
export class NeighbourParking {
  readonly tier: NeighbourTier;
  private readonly owned: boolean;
  /** Snapshot id → the engine whose suspend parked it. */
  private readonly owners = new Map<string, string>();
  private readonly parks: Counter<'engine' | 'result'>;
  private readonly hits: Counter<'engine'>;
  private readonly evictions: Counter<'reason'>;

  constructor(
    options: SwapNeighbourOptions,
    registry: Registry,
    private readonly events: SwapEmitter,
    /** Told when an engine's parked copy is evicted (with the snapshot id). */
    private readonly onEvicted: (engine: string, snapshotId: string) => void = () => undefined,
  ) {
    this.owned = !(options instanceof NeighbourTier);
    this.tier = options instanceof NeighbourTier ? options : NeighbourTier.create({ device: options.device, budgetBytes: options.budgetBytes });
    const registers = [registry];
    const tier = this.tier;
    new Gauge({
      name: 'vsnap_neighbour_parked_bytes',
      help: "Bytes of suspended engines' weights parked in the neighbour GPU's tier",
      labelNames: ['device'],
      registers,
      collect() {
        this.set({ device: String(tier.device) }, tier.closed ? 0 : tier.usedBytes);
      },
    });
    this.parks = new Counter({ name: 'vsnap_neighbour_parks_total', help: 'Weights parked in the neighbour tier at a suspend, by result (parked, already, skipped)', labelNames: ['engine', 'result'], registers });
    this.hits = new Counter({ name: 'vsnap_neighbour_hits_total', help: 'Restores served from the neighbour tier (peer copy)', labelNames: ['engine'], registers });
    this.evictions = new Counter({ name: 'vsnap_neighbour_evictions_total', help: 'Parked weights evicted from the neighbour tier, by reason', labelNames: ['reason'], registers });
  }

  /** The tier as the planner sees it. */
  plan(): PlanNeighbour {
    const parked = this.tier.closed ? [] : this.tier.entries().map((e) => ({ ...e, engine: this.owners.get(e.id) }));
    return { device: this.tier.device, budgetBytes: this.tier.budgetBytes, parked };
  }

  /** Whether an engine on these GPUs can be parked at all. */
  parkable(devices: readonly number[]): boolean {
    return !this.tier.closed && parkable(this.plan(), { devices });
  }

  /** The suspend's park option: the planner decides, evicting what it names first (never the copy of `forEngine`). */
  parkOptions(engine: string, input: () => PlanInput, forEngine?: string): NeighbourParkOptions {
    return {
      tier: this.tier,
      admit: (bytes) => {
        const decision = planPark(input(), engine, bytes, forEngine);
        for (const id of decision.evict) this.evict(id, 'lru');
        if (!decision.park) this.parks.inc({ engine, result: 'skipped' });
        return decision.park;
      },
    };
  }

  /** After a suspend: records what was parked for `engine`, and evicts its older (stale) captures. */
  parked(engine: string, result: NeighbourParkResult | undefined, snapshotId: string): void {
    if (!result) return;
    this.parks.inc({ engine, result: result.already ? 'already' : 'parked' });
    this.owners.set(snapshotId, engine);
    for (const [id, owner] of [...this.owners]) if (owner === engine && id !== snapshotId) this.evict(id, 'stale');
    if (!result.already) this.events.emit('parked', { engine, snapshotId, device: result.device, bytes: result.bytes, seconds: result.seconds });
  }

  /** After a restore that came from the tier. */
  hit(engine: string): void {
    this.hits.inc({ engine });
  }

  /** Evicts one entry (the planner's `evictParked`, or a park's LRU / stale eviction). */
  evict(id: string, reason: EvictReason, forEngine?: string): void {
    const engine = this.owners.get(id);
    this.owners.delete(id);
    if (!this.tier.evict(id)) return;
    this.evictions.inc({ reason });
    if (engine) this.onEvicted(engine, id);
    this.events.emit('neighbourEvicted', { snapshotId: id, ...(engine ? { engine } : {}), reason, ...(forEngine ? { for: forEngine } : {}) });
  }

  /** Bytes parked for an engine now. */
  bytesOf(engine: string): number {
    if (this.tier.closed) return 0;
    return this.tier.entries().filter((e) => this.owners.get(e.id) === engine).reduce((n, e) => n + e.bytes, 0);
  }

  view(): NeighbourView {
    const entries = this.tier.closed ? [] : this.tier.entries();
    return {
      device: this.tier.device,
      budgetBytes: this.tier.budgetBytes,
      usedBytes: this.tier.closed ? 0 : this.tier.usedBytes,
      entries: entries.map((e) => ({ id: e.id, ...(this.owners.has(e.id) ? { engine: this.owners.get(e.id)! } : {}), bytes: e.bytes })),
    };
  }

  /** Frees what the tier holds when the controller made it. */
  close(): void {
    if (this.owned) this.tier.close();
  }
}
