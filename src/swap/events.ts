import type { EventEmitter } from 'node:events';

import type { ErrorCode, VsnapError } from '../errors.js';
import type { RecoveryReason } from '../flows/recovery.js';
import type { EngineView, SwapEvent } from './types.js';

/* The SwapController's events: one payload type each, and the map its EventEmitter is typed with. */

/**
 * A suspend or restore begins (`swapStarted`).
 * @public
 */
export interface SwapStartedEvent {
  /** The model name. */
  readonly engine: string;
  /** What begins. */
  readonly action: 'suspend' | 'restore';
}

/**
 * A suspend, restore or tier-0 demotion failed (`swapFailed`): the full error, for the operator's
 * log (clients get a short message).
 * @public
 */
export interface SwapFailedEvent {
  /** The model name. */
  readonly engine: string;
  /** What failed: `demote` is the release of its tier-0 weights, refused by the dirty check. */
  readonly action: 'suspend' | 'restore' | 'demote';
  /** Why, with paths and details. */
  readonly error: VsnapError;
}

/**
 * An engine's snapshot was found unable to bring it back (`snapshotDamaged`); see {@link EngineView.snapshotProblem}.
 * @public
 */
export interface SnapshotDamagedEvent {
  /** The model name. */
  readonly engine: string;
  /** The capture concerned (undefined: the store has none). */
  readonly snapshotId: string | undefined;
  /** Short, without paths: what clients are told. */
  readonly reason: string;
  /** The full error message, for the operator. */
  readonly detail: string | undefined;
}

/**
 * A restore went through the engine's own loader, its snapshot could not be used (`recovered`);
 * see {@link SwapControllerOptions.recovery}.
 * @public
 */
export interface RecoveredEvent {
  /** The model name. */
  readonly engine: string;
  /** Why the snapshot could not be used. */
  readonly reason: RecoveryReason;
  /** The snapshot's error code. */
  readonly code: ErrorCode;
  /** The snapshot's error message. */
  readonly message: string;
  /** How long the recovery took. */
  readonly seconds: number;
  /** Whether the engine's answer was checked against the snapshot's expected response. */
  readonly expectedResponse: 'matched' | 'unchecked';
}

/**
 * The new snapshot captured in the background after a recovery is published (`materialized`).
 * @public
 */
export interface MaterializedEvent {
  /** The model name. */
  readonly engine: string;
  /** The new capture. */
  readonly snapshotId: string;
}

/**
 * The background capture after a recovery failed (`materializeFailed`).
 * @public
 */
export interface MaterializeFailedEvent {
  /** The model name. */
  readonly engine: string;
  /** Why. */
  readonly error: VsnapError;
}

/**
 * A suspend parked the engine's weights in the neighbour tier (`parked`).
 * @public
 */
export interface ParkedEvent {
  /** The model name. */
  readonly engine: string;
  /** The capture parked. */
  readonly snapshotId: string;
  /** The GPU holding it. */
  readonly device: number;
  /** Bytes parked. */
  readonly bytes: number;
  /** How long the peer copy and its check took. */
  readonly seconds: number;
}

/**
 * Parked weights were evicted from the neighbour tier (`neighbourEvicted`).
 * @public
 */
export interface NeighbourEvictedEvent {
  /** The capture evicted. */
  readonly snapshotId: string;
  /** The engine it was parked for, when known. */
  readonly engine?: string;
  /**
   * Why: `room` (a wake on that GPU needed the memory), `budget` (the GPU was over its budget),
   * `lru` (a newer park needed the tier's room), `stale` (the engine was captured again).
   */
  readonly reason: 'room' | 'budget' | 'lru' | 'stale';
  /** With `room`: the engine the room was for. */
  readonly for?: string;
}

/**
 * A warning from a suspend or restore (`warning`): a park skipped, a fallback taken.
 * @public
 */
export interface SwapWarningEvent {
  /** The model name. */
  readonly engine: string;
  /** What happened. */
  readonly message: string;
}

/**
 * Every event of a {@link SwapController}, with its payload: `controller.on('swap', (e) => e.seconds)` is typed.
 * @public
 */
export interface SwapControllerEvents {
  /** A suspend or restore begins. */
  swapStarted: [event: SwapStartedEvent];
  /** A suspend or restore finished, with its timings and the tier the weights came from. */
  swap: [event: SwapEvent];
  /** A suspend, restore or demotion failed; the engine's state was read back (see {@link EngineView}). */
  swapFailed: [event: SwapFailedEvent];
  /** An engine's snapshot cannot bring it back: no engine is suspended for it until it is re-captured or verified. */
  snapshotDamaged: [event: SnapshotDamagedEvent];
  /** A restore recovered through the engine's own loader. */
  recovered: [event: RecoveredEvent];
  /** The capture after a recovery was published. */
  materialized: [event: MaterializedEvent];
  /** The capture after a recovery failed. */
  materializeFailed: [event: MaterializeFailedEvent];
  /** With a neighbour tier: a suspend parked the engine's weights there. */
  parked: [event: ParkedEvent];
  /** With a neighbour tier: parked weights were evicted. */
  neighbourEvicted: [event: NeighbourEvictedEvent];
  /** A warning from a suspend or restore. */
  warning: [event: SwapWarningEvent];
  /** After every change of state: every engine's view, as {@link SwapController.states} returns it. */
  change: [engines: EngineView[]];
}

/** The controller as the executor and the neighbour tier emit its events. @internal */
export type SwapEmitter = EventEmitter<SwapControllerEvents>;
