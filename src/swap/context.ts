import { engineControl } from '../engine/control.js';
import type { VsnapError } from '../errors.js';
import type { SwapEmitter } from './events.js';
import type { SwapMetrics } from './metrics.js';
import { NeighbourParking } from './neighbour-parking.js';
import type { SwapConfig } from './options.js';
import { planInput, residentBytes } from './plan-input.js';
import type { EngineState, PlanInput } from './planner.js';
import type { Damage } from './readiness.js';
import { answered, damaged, engineState, takeWaiters, unparked, unreachable, viewOf, type Slot } from './state.js';
import type { EngineView } from './types.js';

/** How long an engine whose swap failed is left alone by background steps (pinned, default, TTL, budget). @internal */
export const RETRY_MS = 10_000;

/**
 * What the executor's steps share: the resolved options, the slots, the metrics, the events, the
 * neighbour tier; and the few effects every step has (the state read back from the engine, a
 * change announced, waiters refused, a snapshot marked damaged).
 * @internal
 */
export class SwapContext {
  /** The neighbour-GPU tier, when configured (made here when the options give a GPU and a budget). */
  readonly neighbour: NeighbourParking | undefined;

  constructor(
    readonly config: SwapConfig,
    readonly slots: ReadonlyMap<string, Slot>,
    readonly metrics: SwapMetrics,
    readonly events: SwapEmitter,
  ) {
    this.neighbour = config.neighbour
      ? new NeighbourParking(config.neighbour, metrics.registry, events, (engine, id) => {
          const slot = slots.get(engine);
          if (slot) unparked(slot, config.ram?.has(id) ? 'ram' : 'store');
        })
      : undefined;
  }

  /** The planner's input now. */
  planInput(): PlanInput {
    return planInput(this.config, this.slots.values(), this.neighbour?.plan());
  }

  /** Tier-0 bytes kept for a suspended engine, per device. */
  residentBytes(slot: Slot): number {
    return residentBytes(this.config, slot);
  }

  /** Every engine's view. */
  views(): EngineView[] {
    return [...this.slots.values()].map((s) => viewOf(s, this.residentBytes(s), this.neighbour?.bytesOf(s.spec.name) ?? 0));
  }

  /** Announces a change of state (the `change` event, the awake gauge). */
  changed(): void {
    this.metrics.awake.set([...this.slots.values()].filter((s) => s.state.kind === 'awake').length);
    this.events.emit('change', this.views());
  }

  /** Refuses every request waiting for an engine. */
  rejectWaiters(slot: Slot, err: VsnapError): void {
    for (const waiter of takeWaiters(slot)) waiter.reject(err);
    this.metrics.queueDepth.set({ engine: slot.spec.name }, 0);
  }

  /** Marks its snapshot unable to bring it back; tells once per reason (`snapshotDamaged`). */
  markDamaged(slot: Slot, damage: Damage, detail: string | undefined): void {
    const fresh = slot.snapshot.damage?.reason !== damage.reason;
    damaged(slot, damage);
    if (fresh) {
      this.events.emit('snapshotDamaged', { engine: slot.spec.name, snapshotId: damage.snapshotId, reason: damage.reason, detail });
      this.changed();
    }
  }

  /** Reads whether an engine is awake or asleep (through its vsnap routes, or the dev routes). */
  async readState(slot: Slot): Promise<EngineState> {
    try {
      answered(slot, (await engineControl(slot.spec.client)).status.sleeping);
    } catch (err) {
      unreachable(slot, (err as Error).message);
    }
    return engineState(slot.state);
  }
}
