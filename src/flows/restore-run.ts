import type { CallOptions, EngineClient, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import { VsnapError } from '../errors.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import { restoreTiers } from '../tiers/index.js';
import type { HydrateTargets, MappedTargets, RestoreRun, Tier, TierName, TierRestore } from '../tiers/tier.js';
import { phaseTimer, warn } from './checks.js';
import type { GpuRemap } from './gpu-remap.js';
import type { FlowHooks } from './hooks.js';
import type { RestorePhase, RestoreRoute } from './phases.js';
import type { RecoveryReason } from './recovery.js';
import { backToSleep, cleanUp, fallBack, finishWake } from './restore-finish.js';
import { earlyOf, kvWakeOf, type EarlyPart, type RestoreStage } from './restore-stage.js';
import { FILL_OVERLAPPED } from './fill-targets.js';
import { filledTargets, mappedTargets } from './restore-targets.js';
import { planTargets, type RestorePlan } from './restore-plan.js';
import type { EngineRestoreOptions, EngineRestoreReport } from './types.js';

/*
 * One restore in progress: what restoreEngine's steps share, and the stage it stands at
 * (restore-stage.ts). restore.ts is the order of the steps; restore-open.ts opens the run,
 * restore-targets.ts makes the targets, restore-finish.ts ends the wake or puts the engine back to
 * sleep. It is the RestoreRun the tiers see (src/tiers/tier.ts).
 */

/** The snapshot asked for could not be opened (or pulled): the error, and whether a recovery may go past it. @internal */
export interface OpenError {
  readonly error: VsnapError;
  readonly reason: RecoveryReason | undefined;
}

/** What a run is opened with (restore-open.ts). @internal */
export interface RunStart {
  readonly started: number;
  readonly client: EngineClient;
  readonly control: EngineControl;
  readonly status: EngineStatus;
  readonly snapshot: Snapshot | undefined;
  readonly openError: OpenError | undefined;
  readonly name: string;
  readonly store: Snapshot['store'];
  readonly options: EngineRestoreOptions;
  /** The seams (hooks.ts): a swap's gate, a test's faults. */
  readonly hooks: FlowHooks;
  readonly plan: RestorePlan;
  readonly remap: GpuRemap | undefined;
  readonly early: EarlyPart;
}

/** @internal */
export class EngineRestoreRun implements RestoreRun {
  readonly phases: Partial<Record<RestorePhase, number>> = {};
  /** From the start of the run: the snapshot opened and the engine's status read count as `prepare`. */
  readonly lap: ((phase: RestorePhase) => void) & { restart(): void };
  readonly tiers: readonly Tier[];
  readonly hooks: FlowHooks;
  readonly hydrate: RestoreRun['hydrate'];
  readonly call: CallOptions;
  readonly started: number;
  readonly client: EngineClient;
  readonly control: EngineControl;
  readonly snapshot: Snapshot | undefined;
  readonly openError: OpenError | undefined;
  readonly name: string;
  readonly store: Snapshot['store'];
  readonly options: EngineRestoreOptions;
  readonly plan: RestorePlan;
  readonly remap: GpuRemap | undefined;
  /** The engine as last read (after a deep resume, a sleep, a tier that fell through). */
  status: EngineStatus;
  stage: RestoreStage;
  /** Tells hooks.afterCopy, once, that the weights' copy is over (see {@link EngineRestoreRun.copyOver}). */
  private told: Promise<void> | undefined;

  constructor(start: RunStart) {
    ({ started: this.started, client: this.client, control: this.control, status: this.status, snapshot: this.snapshot, openError: this.openError } = start);
    ({ name: this.name, store: this.store, options: this.options, hooks: this.hooks, plan: this.plan, remap: this.remap } = start);
    this.stage = { stage: 'prepared', early: start.early };
    this.lap = phaseTimer(this.phases as Record<string, number>, start.started);
    this.call = this.options.signal ? { signal: this.options.signal } : {};
    this.tiers = restoreTiers(this.options.tiers ?? {});
    const t = this.options.transfer ?? {};
    this.hydrate = { threads: t.threads, onProgress: t.onProgress, directIo: t.directIo, verify: this.plan.checks.blobs, verifyDigests: this.plan.checks.digests };
  }

  warn(message: string): void {
    warn(this.options, message);
  }

  targets(use: { fill: true }): Promise<HydrateTargets>;
  targets(use?: { fill?: false }): Promise<MappedTargets>;
  async targets(use: { fill?: boolean } = {}): Promise<HydrateTargets> {
    const s = this.stage;
    if (s.stage === 'mapped' || (s.stage === 'filled' && use.fill)) return s.targets;
    if (s.stage !== 'prepared') throw new VsnapError('E_INTERNAL', `a tier asked for ${use.fill ? 'targets' : 'mapped targets'} at stage ${s.stage}`);
    return use.fill && planTargets(this.status, this.remap) === 'fill' ? filledTargets(this, s.early) : mappedTargets(this, s.early);
  }

  /** Lets go of the first part of the memory made before the engine was read now (a deep resume needs the GPU), and makes none of it count from here on. */
  async dropEarly(): Promise<void> {
    const early = earlyOf(this.stage);
    if (this.stage.stage === 'prepared') this.stage = { stage: 'prepared', early: undefined };
    await (await early)?.close();
  }

  /** Lets go of the memory made before the engine was read, where nothing took it (idempotent: what was taken is closed by its taker). */
  async releaseEarly(): Promise<void> {
    await (await earlyOf(this.stage))?.close();
  }

  /** After a hydrate: its digest time apart, the phases that ran beside it, then the rest of the wake. */
  async afterHydrate(outcome: TierRestore): Promise<void> {
    this.lap('hydrate');
    if (outcome.digestSeconds !== undefined) {
      this.phases.hydrate! -= outcome.digestSeconds;
      this.phases.verifyDigests = outcome.digestSeconds;
    }
    const s = this.stage;
    if (s.stage === 'filled') {
      // The engine maps the filled memory: once it has, its handles keep it (ours go during the check).
      await s.wake.done;
      this.lap('wakeWeightsWait');
      for (const phase of FILL_OVERLAPPED) if (s.beside[phase] !== undefined) this.phases[phase] = s.beside[phase];
    }
    if (s.stage === 'mapped') s.exported.close();
    await this.finishWake();
  }

  /**
   * Tells hooks.afterCopy, once, that the weights' copy is over: landed, not needed (tier 0), or
   * failed (`failed`: its error is then not thrown, the first one is what the restore reports).
   * swapEngines lets the other engine sleep only then, and a KV wake waits for that sleep, so it is
   * told before anything may wait for room: as the hydrate returns, at the start of every finishWake
   * (tier 0 and a recovery finish theirs inside), and first on a failure path.
   */
  copyOver(failed: boolean): Promise<void> {
    if (this.told) return this.told; // told already: settled, quietly
    const telling = (async () => void (await this.hooks.afterCopy?.()))();
    this.told = telling.catch(() => undefined);
    return failed ? this.told : telling;
  }

  finishWake(expected: ExpectedResponse | null = this.snapshot?.manifest.data.expectedResponse ?? null, path: 'restored' | 'recovered' = 'restored'): Promise<void> {
    return finishWake(this, expected, path);
  }

  fallBack(what: string, failure: VsnapError): Promise<void> {
    return fallBack(this, what, failure);
  }

  /** Puts the engine back to sleep if it holds weights; `wakeRest`: see sleepAgain (default: unless in a swap whose room never opened). */
  backToSleep(wakeRest = !this.plan.awaitsRoom): Promise<{ state: string; asleep: boolean }> {
    return backToSleep(this, wakeRest);
  }

  cleanUp(err: unknown): Promise<VsnapError> {
    return cleanUp(this, err);
  }

  /** The report of a restore served by a tier (`by`). */
  report(outcome: TierRestore, by: TierName): EngineRestoreReport {
    const s = this.stage;
    const route: RestoreRoute = s.stage === 'filled' ? 'filled' : s.stage === 'mapped' ? 'mapped' : by === 'engine' ? 'kept' : 'adopted';
    const kv = kvWakeOf(s);
    const overlapped: RestorePhase[] = outcome.finished ? [] : [...(s.stage === 'filled' ? FILL_OVERLAPPED.filter((p) => this.phases[p] !== undefined) : []), ...(kv ? (Object.keys(kv.phases) as RestorePhase[]) : [])];
    return {
      bytes: outcome.bytes,
      tier: outcome.tier,
      seconds: (performance.now() - this.started) / 1000,
      route,
      phases: this.phases,
      path: 'restored',
      ...(this.remap && s.stage === 'mapped' ? { gpus: s.exported.ranks.map((r) => r.deviceUuid) } : {}),
      ...(outcome.devices ? { devices: outcome.devices } : {}),
      ...(outcome.multipath ? { multipath: outcome.multipath } : {}),
      ...(overlapped.length ? { overlapped } : {}),
    };
  }
}
