import { toVsnapError, VsnapError } from '../errors.js';
import type { CallOptions, EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl, type EngineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import { liveRefs, mapExported } from '../engine/exported.js';
import { compareResponses, recheck } from '../engine/response-check.js';
import { listDevices } from '../gpu/cuda.js';
import type { ExpectedResponse } from '../manifest/types.js';
import { type MappedRegions, type MappedRegionsOptions } from '../regions/mapped.js';
import { pullIfMissing } from '../registry/source.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { RestoreRegion } from '../snapshot/snapshot-types.js';
import { restoreTiers } from '../tiers/index.js';
import type { FilledTargets, HydrateTargets, MappedTargets, RestoreRun, Tier, TierRestore } from '../tiers/tier.js';
import { holdsWeights, liveFacts, liveRanks, phaseTimer, preflight, warn } from './checks.js';
import { resumeIfDeep } from './deep.js';
import { makeEarlyFill, type EarlyFill, type FillMemory } from './fill.js';
import { FILL_OVERLAPPED, startFill, type FillWake } from './fill-targets.js';
import { sleepAgain } from './sleep-again.js';
import { checkMoved, checkRoom, describeRoom, resolveRemap, type GpuRemap } from './gpu-remap.js';
import type { FlowHooks } from './hooks.js';
import { awaitRoom, startKvWake, type EarlyWake } from './kv-overlap.js';
import { recoveryReason, type MaterializePolicy, type RecoveryReason } from './recovery.js';
import type { EngineRestoreOptions, EngineRestoreReport, SnapshotRef } from './types.js';

/*
 * One restore in progress: what restoreEngine's steps share (restore.ts is the order of the steps,
 * this file the steps). It is the RestoreRun the tiers see (src/tiers/tier.ts).
 */

/** The snapshot asked for could not be opened (or pulled): the error, and whether a recovery may go past it. */
interface OpenError {
  readonly error: VsnapError;
  readonly reason: RecoveryReason | undefined;
}

/**
 * How a restore maps the engine's regions: pipelined (the copy starts on the first regions while
 * the rest are imported; measured on the H200 the fastest form at every region count, 36 to 4,000:
 * bench/results/2026-12-01-h200-region-count.log).
 * @internal
 */
export const RESTORE_MAPPING: MappedRegionsOptions = { mapping: 'pipelined' };

/**
 * Opens the snapshot, pulling it first when it has a registry source. One that cannot be opened
 * fails the restore, unless it may be recovered from (or the engine's own tier may hold the weights).
 */
async function openSnapshot(
  source: Snapshot | SnapshotRef,
  client: EngineClient,
  options: EngineRestoreOptions,
  recovery: { reload: boolean },
): Promise<{ snapshot?: Snapshot; openError?: OpenError }> {
  if ('manifest' in source) return { snapshot: source }; // structural: a Snapshot of the other build (ESM/CJS) too
  try {
    await pullIfMissing(source, client, { signal: options.signal, allowModelSwap: options.allowModelSwap });
    return { snapshot: await Snapshot.open(source.store, source.name, source.id !== undefined ? { id: source.id } : {}) };
  } catch (err) {
    const error = toVsnapError(err);
    const reason = recovery.reload ? recoveryReason(error, undefined, undefined, options) : undefined;
    // Only the engine's own tier can restore without the snapshot; otherwise this is the end.
    if (!reason && !options.tiers?.engine) throw error;
    return { openError: { error, reason } };
  }
}

/** @internal */
export class EngineRestoreRun implements RestoreRun {
  readonly phases: Record<string, number> = {};
  /** From the start of {@link EngineRestoreRun.open}: the snapshot opened and the engine's status read count as `prepare`. */
  readonly lap: ReturnType<typeof phaseTimer>;
  readonly tiers: readonly Tier[];
  readonly recovery: { reload: boolean; materialize: MaterializePolicy };
  readonly hooks: FlowHooks;
  readonly hydrate: RestoreRun['hydrate'];
  readonly call: CallOptions;
  status: EngineStatus;
  remap: GpuRemap | undefined;
  private exported: ExportedRegions | undefined;
  private mapped: MappedRegions | undefined;
  private prepared: HydrateTargets | undefined;
  private copyTold = false;
  private early: EarlyWake | undefined;
  /** Memory made here for the weights, part by part as it was made. */
  private readonly fill: FillMemory[] = [];
  private fillWake: FillWake | undefined;
  /** The first part of the memory made before the engine was read (open), for fillTargets to take. */
  private earlyFill: Promise<EarlyFill | undefined> | undefined;
  /** The phases of a filled restore that ran beside the hydrate, with their own seconds (listed after it, in FILL_OVERLAPPED's order). */
  private readonly besideHydrate: Record<string, number> = {};

  private constructor(
    readonly started: number,
    readonly client: EngineClient,
    readonly control: EngineControl,
    status: EngineStatus,
    readonly snapshot: Snapshot | undefined,
    readonly openError: OpenError | undefined,
    readonly name: string,
    readonly store: Snapshot['store'],
    readonly options: EngineRestoreOptions,
    recovery: { reload: boolean; materialize: MaterializePolicy },
  ) {
    this.lap = phaseTimer(this.phases, started);
    this.status = status;
    this.recovery = recovery;
    this.hooks = options.hooks ?? {};
    this.call = options.signal ? { signal: options.signal } : {};
    this.tiers = restoreTiers(options.tiers ?? {});
    const t = options.transfer ?? {};
    this.hydrate = {
      ...(t.threads ? { threads: t.threads } : {}),
      ...(t.onProgress ? { onProgress: t.onProgress } : {}),
      ...(t.directIo !== undefined ? { directIo: t.directIo } : {}),
      ...(options.verify?.blobs ? { verify: options.verify.blobs } : {}),
      ...(options.verify?.digests !== undefined ? { verifyDigests: options.verify.digests } : {}),
    };
  }

  /**
   * Prepare: opens the snapshot (pulling it first when it has a registry source), before the
   * engine is touched: one that cannot be opened fails here, unless it may be recovered from;
   * then reads the engine and resolves a move onto other GPUs (checked before anything changes).
   */
  static async open(source: Snapshot | SnapshotRef, client: EngineClient, options: EngineRestoreOptions, recovery: { reload: boolean; materialize: MaterializePolicy }): Promise<EngineRestoreRun> {
    const started = performance.now();
    // The snapshot first: one that cannot be opened (and not recovered from) fails the restore
    // before the engine is asked anything.
    const { snapshot, openError } = await openSnapshot(source, client, options, recovery);
    // The first part of the weights' memory is made while the engine is read (restore.ts lets go
    // of it on every path where it is not used).
    // Where the RAM tier holds the snapshot, the copy into that memory starts at once too: into
    // memory of this process's own, so an engine that turns out not to match loses nothing.
    const ram = options.tiers?.ram;
    const startCopy =
      snapshot && ram
        ? (regions: readonly RestoreRegion[]) => snapshot.startRestore(ram, regions, { ...(options.transfer?.onProgress ? { onProgress: options.transfer.onProgress } : {}), ...(options.signal ? { signal: options.signal } : {}) })
        : undefined;
    const early = snapshot && mayFillEarly(snapshot, client, options) ? makeEarlyFill(snapshot.manifest, startCopy) : undefined;
    let control: EngineControl;
    let status: EngineStatus;
    try {
      ({ control, status } = await engineControl(client, options.signal ? { signal: options.signal } : {}));
      preflight(status, options);
    } catch (err) {
      await (await early)?.close();
      throw err;
    }
    const store = snapshot?.store ?? (source as SnapshotRef).store;
    const name = snapshot?.name ?? (source as SnapshotRef).name;
    const run = new EngineRestoreRun(started, client, control, status, snapshot, openError, name, store, options, recovery);
    run.earlyFill = early;
    const move = options.move;
    if (move?.onto !== undefined || move?.gpuMap !== undefined) {
      const onGpus = status.ranks.every((r) => r.memory === 'cuda'); // a host-memory engine is refused without listing GPUs
      run.remap = resolveRemap(status, onGpus ? await listDevices() : [], move);
    }
    return run;
  }

  warn(message: string): void {
    warn(this.options, message);
  }

  /**
   * A deep-suspended engine (found by the driver's state of its pids): every rank restored (onto
   * its new GPU with a move, after a check that each has room for the process and its weights: a
   * move the driver refuses for memory may leave the process unrestorable, see gpu-remap.ts) and
   * unlocked first.
   */
  async resumeDeep(): Promise<void> {
    const remap = this.remap;
    const weights: number[] = [];
    for (const r of this.status.ranks) weights[r.rank] = Math.max(r.bytes, this.snapshot?.manifest.data.ranks.find((m) => m.rank === r.rank)?.regions.reduce((n, x) => n + x.size, 0) ?? 0);
    const roomCheck = remap ? async () => describeRoom(checkRoom(remap, await listDevices({ freeMemory: true }), weights, this.options.move?.reserveBytes)) : undefined;
    const opened = (performance.now() - this.started) / 1000;
    // A checkpointed process needs its GPU memory back: memory made here early goes first.
    const deep = await resumeIfDeep(this.status, this.hooks.checkpoint, remap?.pairs, roomCheck, () => this.dropEarly());
    if (!deep) return;
    this.phases.open = opened; // the snapshot opened and the engine read, before its processes were restored
    for (const [step, seconds] of Object.entries(deep)) this.phases[`deep.${step}`] = seconds;
    this.lap.restart();
    this.status = await this.control.status(this.call);
  }

  /** An awake engine is refused, unless the caller swaps models in place (it is put to sleep first). */
  async sleepIfAwake(): Promise<void> {
    if (!this.status.sleeping) {
      if (!this.options.allowModelSwap) {
        throw new VsnapError('E_ENGINE_STATE', 'the engine is awake: restoring would overwrite a working model. Suspend it first, or pass allowModelSwap to swap models in place.');
      }
      await this.control.sleep(2, undefined, this.call);
      this.lap('sleep');
      this.status = await this.control.status(this.call);
    }
    this.lap('prepare'); // the engine's status, the snapshot opened, the driver asked whether a rank is checkpointed
  }

  targets(use: { fill: true }): Promise<HydrateTargets>;
  targets(use?: { fill?: false }): Promise<MappedTargets>;
  async targets(use: { fill?: boolean } = {}): Promise<HydrateTargets> {
    if (this.prepared) {
      if (this.prepared.kind === 'filled' && !use.fill) throw new VsnapError('E_INTERNAL', 'a tier asked for mapped targets after another was given memory made here');
      return this.prepared;
    }
    if (use.fill && this.mayFill()) return (this.prepared = await this.fillTargets());
    const snapshot = this.snapshot!;
    if (this.status.ranks.some((r) => !r.weightsMapped)) await this.control.wake(['weights'], this.call);
    this.lap('wakeWeights');
    const exported = (this.exported = await exportRegions(this.control, this.status.ranks.length, this.call));
    this.lap('export');
    if (this.remap) checkMoved(exported, this.remap);
    snapshot.manifest.assertCompatible({ ...liveFacts(this.status, exported, this.options.allowModelSwap ?? false), ranks: liveRanks(exported) });
    this.lap('validate');
    // Mapped once, on a few threads: the hydrate and the GPU digest that verifies it share the mappings.
    const mapped = (this.mapped = await mapExported(exported, RESTORE_MAPPING));
    const live = liveRefs(exported, mapped);
    this.lap('map');
    // With overlapKvWake the KV cache wakes now; its failure stops the hydrate (and the other way
    // round, a failure waits for it before the engine goes back to sleep).
    const stop = new AbortController();
    if (this.options.overlapKvWake) this.early = startKvWake(this.control, this.tagsAfterWeights(), this.call, this.hooks.beforeKvWake, (e) => stop.abort(e));
    const signal = this.early ? (this.call.signal ? AbortSignal.any([this.call.signal, stop.signal]) : stop.signal) : this.call.signal;
    const regions = live.map((x, i) => ({ key: x.key, size: x.size, tag: exportedTag(exported, i), rank: x.rank, memory: x.memory }));
    return (this.prepared = { kind: 'mapped', direct: liveRefs(exported), mapped: live, regions, signal, ranks: exported.ranks.length });
  }

  /**
   * Whether this restore can fill memory of its own for the weights: every rank asleep with its
   * weights unmapped, a plugin that describes its regions while asleep, and no move onto other GPUs
   * (the memory would have to be made on the GPU the process is not on yet).
   */
  private mayFill(): boolean {
    return !this.remap && this.status.sleeping && this.status.ranks.every((r) => r.describe === true && !r.weightsMapped);
  }

  /** The weights' targets made here (fill-targets.ts), the engine's wake of them beside the hydrate. */
  private async fillTargets(): Promise<FilledTargets> {
    const started = await startFill({
      control: this.control,
      status: this.status,
      manifest: this.snapshot!.manifest,
      call: this.call,
      allowModelSwap: this.options.allowModelSwap ?? false,
      lap: this.lap,
      overlapped: (phase, seconds) => void (this.besideHydrate[phase] = seconds),
      ...(this.options.overlapKvWake ? { kvWake: { tags: this.tagsAfterWeights(), before: this.hooks.beforeKvWake } } : {}),
      made: (fill) => void this.fill.push(fill),
      ...(this.earlyFill ? { early: this.earlyFill } : {}),
    });
    this.fillWake = started.wake;
    this.early = started.early;
    return started.targets;
  }

  /**
   * Lets go of the memory made before the engine was read, where the restore did not take it (a
   * tier that needs none, an engine that cannot adopt it, a failure first): run by restoreEngine
   * at its end, on every path. Closing memory the restore took is a no-op by then (letGo, cleanUp).
   */
  async releaseEarly(): Promise<void> {
    await (await this.earlyFill)?.close();
  }

  /** Lets go of the memory made early now, and makes none of it count from here on. */
  private async dropEarly(): Promise<void> {
    const early = this.earlyFill;
    this.earlyFill = undefined;
    await (await early)?.close();
  }

  /** After a hydrate: its digest time apart, and the phases that ran beside it, then the rest of the wake. */
  async afterHydrate(outcome: TierRestore): Promise<void> {
    this.lap('hydrate');
    if (outcome.digestSeconds !== undefined) {
      this.phases.hydrate! -= outcome.digestSeconds;
      this.phases.verifyDigests = outcome.digestSeconds;
    }
    if (this.fillWake) {
      // The engine maps the filled memory: once it has, its handles keep it (ours go during the check).
      await this.fillWake.done;
      this.lap('wakeWeightsWait');
      for (const phase of FILL_OVERLAPPED) if (this.besideHydrate[phase] !== undefined) this.phases[phase] = this.besideHydrate[phase];
    }
    this.exported?.close();
    await this.finishWake();
  }

  /**
   * Lets go of this process's hold on the engine's weights: the mappings of the hydrate and the
   * handles of memory made here (the engine's own keep the memory). Run while the engine answers the
   * check: unmapping hundreds of regions takes milliseconds the wake need not wait for.
   */
  private async letGo(): Promise<void> {
    const mapped = this.mapped;
    const fill = this.fill.splice(0);
    await Promise.all([mapped?.close(), ...fill.map((f) => f.close())]);
  }

  /**
   * The tags a restore wakes after the weights: the KV cache, by name, alone. vLLM's executor counts
   * only `weights` and `kv_cache` asleep and skips a whole wake that names any other tag
   * (vllm/v1/executor/abstract.py `wake_up`); other pools come back with any wake (the `cudagraph`
   * pool of --sleep-mode-offload-cudagraph: docs/features/sleep_mode.md).
   */
  tagsAfterWeights(): string[] {
    return ['kv_cache'];
  }

  /** Whether a failed restore may wake the KV cache to put the engine back to sleep: not in a swap whose room never opened (the other engine still holds the GPU). */
  private mayWakeRest(): boolean {
    return !this.hooks.beforeKvWake;
  }

  /**
   * Tells hooks.afterCopy, once, that the weights' copy is over: landed, not needed (tier 0), or
   * failed (`failed`: its error is then not thrown, the first one is what the restore reports).
   * swapEngines lets the other engine sleep only then, and a KV wake waits for that sleep, so it is
   * told before anything may wait for room: as the hydrate returns, at the start of every finishWake
   * (tier 0 and a recovery finish theirs inside), and first on a failure path.
   */
  async copyOver(failed: boolean): Promise<void> {
    if (this.copyTold) return;
    this.copyTold = true;
    try {
      await this.hooks.afterCopy?.();
    } catch (err) {
      if (!failed) throw err;
    }
  }

  async finishWake(expected: ExpectedResponse | null = this.snapshot?.manifest.data.expectedResponse ?? null, path: 'restored' | 'recovered' = 'restored'): Promise<void> {
    await this.copyOver(false);
    let resetting: Promise<void>;
    if (this.early) {
      // Started during the hydrate (overlapKvWake): what is left of it is waited for here.
      await this.early.done;
      Object.assign(this.phases, this.early.phases);
      this.lap('wakeKvCacheWait');
      resetting = this.control.resetPrefixCache(this.call);
    } else {
      // The prefix cache is emptied beside the KV cache's wake (and the wait for room before it),
      // not after: it is the scheduler's bookkeeping, not GPU memory, and no request runs in
      // between (the engine runs none while its KV cache sleeps), so the order does not
      // matter and the round trip is saved.
      resetting = this.control.resetPrefixCache(this.call);
      resetting.catch(() => undefined); // awaited below
      try {
        if (this.hooks.beforeKvWake) {
          await awaitRoom(this.hooks.beforeKvWake);
          this.lap('awaitRoom');
        }
        // The KV cache by name (tagsAfterWeights). Never a wake of all tags: before vLLM PR #52514 that
        // maps the woken weights a second time (vllm/device_allocator/cumem.py `wake_up`), which fails
        // and unmaps them.
        await this.control.wake(this.tagsAfterWeights(), this.call);
        this.lap('wakeKvCache');
      } catch (err) {
        await resetting.catch(() => undefined); // no call to the engine outlives the restore
        throw err;
      }
    }
    await resetting;
    this.lap('resetPrefixCache');
    if (!expected) return this.letGo();
    await this.hooks.beforeCheck?.();
    const checking = recheck(this.client, expected, this.options.signal);
    checking.catch(() => undefined); // awaited below
    await this.letGo();
    const actual = await checking;
    this.lap('expectedResponse');
    const difference = compareResponses(expected, actual, this.options.verify?.logprobTolerance ?? 0);
    if (!difference) return;
    throw new VsnapError(
      'E_RESPONSE_MISMATCH',
      path === 'restored'
        ? `after restoring '${this.name}' the engine's answer differs from the one recorded at capture: ${difference}. ` +
          'The weights verified byte for byte, so state outside the snapshot is wrong (an attention backend such as FlashInfer keeps some).'
        : `after the engine reloaded its weights, its answer differs from the one '${this.name}' recorded at capture: ${difference}. ` +
          'Its checkpoint is not the one the snapshot was taken from (or state outside the weights is wrong).',
      { expected, actual, difference },
    );
  }

  async fallBack(what: string, failure: VsnapError): Promise<void> {
    this.status = await this.reread(what, failure);
    if (!holdsWeights(this.status)) return;
    try {
      await sleepAgain(this.control, this.status, this.call, this.mayWakeRest());
    } catch (err) {
      const e = toVsnapError(err);
      throw new VsnapError(e.code, `${what} failed (${failure.message}) and putting the engine back to sleep failed too (${e.message}); check it before sending requests`, { ...e.details, recovered: false }, { cause: failure });
    }
    this.status = await this.reread(what, failure);
  }

  /** Re-reads the engine after a failed step; an engine that no longer answers ends the restore. */
  private async reread(what: string, cause: VsnapError): Promise<EngineStatus> {
    try {
      return await this.control.status(this.call);
    } catch (err) {
      const e = toVsnapError(err);
      throw new VsnapError(e.code, `${what} failed (${cause.message}), and the engine no longer answers (${e.message}). Restart it; its snapshot brings the weights back.`, { ...e.details, recovered: false }, { cause: e });
    }
  }

  /**
   * Reads the engine back and puts it to sleep only if it holds weights (an engine that never woke
   * is left alone); `wakeRest`: see {@link sleepAgain} (default: unless in a swap whose room never opened).
   */
  async backToSleep(wakeRest = this.mayWakeRest()): Promise<{ state: string; asleep: boolean }> {
    let status: EngineStatus;
    try {
      status = await this.control.status();
    } catch (err) {
      return { state: `the engine no longer answers (${(err as Error).message}); restart it`, asleep: false };
    }
    if (!holdsWeights(status)) return { state: 'the engine is asleep', asleep: true };
    try {
      const freed = await sleepAgain(this.control, status, {}, wakeRest);
      return freed
        ? { state: 'the engine was put back to sleep', asleep: true }
        : { state: "the engine is asleep, its weights still mapped (vLLM's executor ignores a sleep while the KV cache is asleep; the next restore or wake frees them)", asleep: true };
    } catch (err) {
      return { state: `putting the engine back to sleep failed too (${(err as Error).message}); check it before sending requests`, asleep: false };
    }
  }

  /**
   * After a failure: the descriptors and mappings dropped (a mapping left would keep the engine's
   * freed weights allocated), a KV wake in flight waited for (a sleep racing it could leave the KV
   * cache awake). Returns the failure's cause: when the hydrate stopped because the KV wake (or
   * the wait before it) failed, that failure.
   */
  async cleanUp(err: unknown): Promise<VsnapError> {
    await this.releaseEarly(); // a copy started early and not taken over stops before its memory goes
    this.exported?.close();
    await this.mapped?.close().catch(() => undefined);
    // Memory made here goes once the engine's wake of it is over (an engine that mapped it keeps it until it sleeps).
    await this.fillWake?.settled;
    await Promise.all(this.fill.splice(0).map((f) => f.close().catch(() => undefined)));
    await this.early?.settled;
    const e = toVsnapError(err);
    if (e.code !== 'E_ABORTED' || this.call.signal?.aborted) return e;
    const wakeFailure = this.fillWake ? await this.fillWake.done.then(() => undefined, (x: unknown) => toVsnapError(x)) : undefined;
    if (wakeFailure) return wakeFailure;
    if (this.early) return this.early.done.then(() => e, (x: unknown) => toVsnapError(x));
    return e;
  }

  /** The phases that ran beside the hydrate. */
  private overlapped(outcome: TierRestore): string[] {
    if (outcome.finished) return [];
    return [...(this.fillWake ? FILL_OVERLAPPED.filter((p) => this.phases[p] !== undefined) : []), ...(this.early ? Object.keys(this.early.phases) : [])];
  }

  /** The report of a restore served by a tier. */
  report(outcome: TierRestore): EngineRestoreReport {
    return {
      bytes: outcome.bytes,
      tier: outcome.tier,
      seconds: (performance.now() - this.started) / 1000,
      phases: this.phases,
      path: 'restored',
      ...(this.remap && this.exported ? { gpus: this.exported.ranks.map((r) => r.deviceUuid) } : {}),
      ...(outcome.devices ? { devices: outcome.devices } : {}),
      ...(outcome.multipath ? { multipath: outcome.multipath } : {}),
      ...(this.overlapped(outcome).length ? { overlapped: this.overlapped(outcome) } : {}),
    };
  }
}

/**
 * Whether a restore may make the first part of the weights' memory before it has read the
 * engine: only where the weights will surely be copied into memory made here (the default
 * targets, the RAM tier or the store) and no tier that keeps them elsewhere (tier 0 holding this
 * engine's weights, the neighbour GPU, the engine's own, two links) or a move can take the
 * restore. Whether the engine can adopt the memory is known only from its status: where it
 * cannot, the memory is let go unused.
 */
function mayFillEarly(snapshot: Snapshot, client: EngineClient, options: EngineRestoreOptions): boolean {
  const t = options.tiers ?? {};
  if (options.move || t.engine || t.neighbour || t.multipath || options.allowModelSwap) return false;
  if (t.gpu?.has(client.baseUrl)) return false;
  return snapshot.durable || (t.ram?.has(snapshot.id) ?? false);
}

/** The tag of the i-th exported region (rank by rank, in the order sent). */
function exportedTag(exported: ExportedRegions, i: number): string {
  for (const r of exported.ranks) {
    if (i < r.regions.length) return r.regions[i]!.tag;
    i -= r.regions.length;
  }
  throw new RangeError(`exported region ${i}`);
}
