import type { CallOptions, EngineClient, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import type { ExportedRegions } from '../engine/export.js';
import type { MappedRegions } from '../regions/mapped.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import type { FilledTargets, MappedTargets } from '../tiers/tier.js';
import type { EarlyFill, FillMemory } from './fill.js';
import type { FillWake } from './fill-targets.js';
import type { GpuRemap } from './gpu-remap.js';
import type { FlowHooks } from './hooks.js';
import type { EarlyWake } from './kv-overlap.js';
import type { RestorePhase } from './phases.js';
import type { RestorePlan } from './restore-plan.js';
import type { EngineRestoreOptions } from './types.js';

/*
 * Where a restore stands, as one union: each stage holds what exists from then on (and must be let
 * go on every path), so no step reads what was not made yet and no flag says what is set.
 */

/** The first part of the weights' memory made before the engine was read (undefined: none was). @internal */
export type EarlyPart = Promise<EarlyFill | undefined> | undefined;

/**
 * A restore's stage (EngineRestoreRun.stage):
 * - `prepared`: the snapshot opened and the engine read; maybe the first part of its memory made;
 * - `filling`: memory being made here for the weights, part by part;
 * - `filled`: that memory, which the engine's wake adopts while the hydrate fills it;
 * - `exported`: the engine's own weights woken and exported;
 * - `mapped`: those mapped here, which the hydrate fills.
 * @internal
 */
export type RestoreStage =
  | { readonly stage: 'prepared'; readonly early: EarlyPart }
  | { readonly stage: 'filling'; readonly early: EarlyPart; readonly memory: FillMemory[] }
  | {
      readonly stage: 'filled';
      readonly early: EarlyPart;
      /** Every part of the memory made here, in the order made. */
      readonly memory: FillMemory[];
      readonly targets: FilledTargets;
      readonly wake: FillWake;
      readonly kvWake: EarlyWake | undefined;
      /** The phases that ran beside the hydrate, with their own seconds, as each ends. */
      readonly beside: Record<string, number>;
    }
  | { readonly stage: 'exported'; readonly exported: ExportedRegions }
  | { readonly stage: 'mapped'; readonly exported: ExportedRegions; readonly mapped: MappedRegions; readonly targets: MappedTargets; readonly kvWake: EarlyWake | undefined };

/** The early part a stage still holds (to let go of where nothing took it). @internal */
export function earlyOf(stage: RestoreStage): EarlyPart {
  return 'early' in stage ? stage.early : undefined;
}

/** The KV-cache wake started beside the hydrate, if any. @internal */
export function kvWakeOf(stage: RestoreStage): EarlyWake | undefined {
  return stage.stage === 'filled' || stage.stage === 'mapped' ? stage.kvWake : undefined;
}

/** What the steps of a restore (restore-targets.ts, restore-finish.ts) use of it: EngineRestoreRun. @internal */
export interface RestoreContext {
  readonly client: EngineClient;
  readonly control: EngineControl;
  readonly snapshot: Snapshot | undefined;
  readonly name: string;
  readonly options: EngineRestoreOptions;
  readonly hooks: FlowHooks;
  readonly call: CallOptions;
  readonly remap: GpuRemap | undefined;
  readonly plan: RestorePlan;
  readonly phases: Partial<Record<RestorePhase, number>>;
  lap(phase: RestorePhase): void;
  /** The engine as last read. */
  status: EngineStatus;
  stage: RestoreStage;
  copyOver(failed: boolean): Promise<void>;
  releaseEarly(): Promise<void>;
}
