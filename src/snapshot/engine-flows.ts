import type { ResidentWeights } from '../cache/resident-weights.js';
import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl, type EngineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import type { ExpectedResponse } from '../manifest/types.js';
import { passOn } from '../transfer/transfer.js';
import { compareResponses, holdsWeights, liveFacts, liveRanks, phaseTimer, preflight, recheck, warn } from './engine-checks.js';
import { resumeIfDeep } from './deep-suspend.js';
import { listDevices } from '../gpu/cuda.js';
import { checkRoom, describeRoom, resolveRemap, type GpuRemap } from './gpu-remap.js';
import { recoverEngine, recoveryReason, type RecoveryReason } from './engine-recovery.js';
import type { Manifest } from '../manifest/manifest.js';
import { liveRefs, mapExported } from './live-check.js';
import { defaultMapping, type MappedRegions, type MappedRegionsOptions } from '../regions/mapped.js';
import { Snapshot } from './snapshot.js';
import { pullIfMissing } from '../registry/source.js';
import { awaitRoom, startKvWake, type EarlyWake } from './kv-overlap.js';
import { hydrateFromNeighbour } from './neighbour-flows.js';
import type { EngineRestoreOptions, EngineRestoreReport, SnapshotRef } from './engine-types.js';
import { captureEngine } from './engine-capture.js';

/*
 * The engine flows: capture, suspend and restore a running engine. A layer above Snapshot (which
 * knows nothing of engines): this module uses Snapshot, never the other way round. restoreEngine
 * lives here; captureEngine in engine-capture.ts, suspendEngine in engine-suspend.ts, their
 * options and reports in engine-types.ts (re-exported here, the flows' one import path).
 */

export * from './engine-types.js';
export { captureEngine } from './engine-capture.js';
export { restorableFor, suspendEngine } from './engine-suspend.js';

/**
 * After a failed restore: reads the engine back and puts it to sleep only if it holds weights (an
 * engine that never woke is left alone). Says what state it is in, and whether it is asleep.
 * `wakeRest`: see {@link sleepAgain}.
 */
async function backToSleep(control: EngineControl, wakeRest: boolean): Promise<{ state: string; asleep: boolean }> {
  let status: EngineStatus;
  try {
    status = await control.status();
  } catch (err) {
    return { state: `the engine no longer answers (${(err as Error).message}); restart it`, asleep: false };
  }
  if (!holdsWeights(status)) return { state: 'the engine is asleep', asleep: true };
  try {
    const freed = await sleepAgain(control, status, {}, wakeRest);
    return freed
      ? { state: 'the engine was put back to sleep', asleep: true }
      : { state: "the engine is asleep, its weights still mapped (vLLM's executor ignores a sleep while the KV cache is asleep; the next restore or wake frees them)", asleep: true };
  } catch (err) {
    return { state: `putting the engine back to sleep failed too (${(err as Error).message}); check it before sending requests`, asleep: false };
  }
}

/**
 * Puts an engine that holds weights back to sleep at level 2. vLLM's executor ignores a sleep while
 * any of its tags is still asleep (vllm/v1/executor/abstract.py `sleep`: "Executor is already
 * sleeping"), so the weights of an engine whose KV cache did not wake are freed only if the KV
 * cache is woken first. That takes the KV cache's memory: `wakeRest` says whether the restore may
 * (false in a swap, whose room gate did not open: the other engine still holds the GPU). Returns
 * whether the weights were let go (false: the sleep was the executor's no-op).
 */
async function sleepAgain(control: EngineControl, status: EngineStatus, call: { signal?: AbortSignal }, wakeRest: boolean): Promise<boolean> {
  const asleep = status.sleeping ? executorTagsAsleep(status) : [];
  if (asleep.length && wakeRest) await control.wake(asleep, call);
  await control.sleep(2, undefined, call);
  return !asleep.length || wakeRest;
}

/**
 * The tags vLLM's executor still counts asleep, by what the allocator reports. The executor tracks
 * `weights` and `kv_cache` only, and skips a whole wake that names a tag it does not count asleep
 * (vllm/v1/executor/abstract.py `wake_up`): never name an awake one. Older plugins do not report
 * the allocator's tags: the KV cache then (the weights are awake: `holdsWeights`).
 */
function executorTagsAsleep(status: EngineStatus): string[] {
  if (status.ranks.every((r) => Array.isArray(r.asleepTags))) {
    const asleep = new Set(status.ranks.flatMap((r) => r.asleepTags ?? []));
    return ['weights', 'kv_cache'].filter((t) => asleep.has(t));
  }
  return ['kv_cache'];
}

/**
 * Restores a snapshot into a suspended engine: wakes the weights, has the workers export them,
 * checks the layout and facts, hydrates with every chunk verified, wakes the KV cache, resets the
 * prefix cache, and re-runs the expected response; only then does it resolve. With tier 0
 * holding the engine's weights, maps them back instead (falling back to the snapshot if that
 * fails). Any failure puts an engine that woke back to sleep and says how to recover. With
 * `recovery: 'reload'`, a snapshot that cannot be used (missing, damaged, incompatible, RAM copy
 * lost) is replaced by the engine's own reload of its weights (see {@link RecoveryReason}).
 * @public
 */
export async function restoreEngine(source: Snapshot | SnapshotRef, client: EngineClient, options: EngineRestoreOptions = {}): Promise<EngineRestoreReport> {
  const started = performance.now();
  const phases: Record<string, number> = {};
  const lap = phaseTimer(phases);
  const call = options.signal ? { signal: options.signal } : {};
  const recovery = options.recovery ?? 'fail';
  if (recovery !== 'fail' && recovery !== 'reload') invalidArgument('recovery', "'fail' or 'reload'", recovery);
  const materialize = options.materialize ?? 'off';
  if (materialize !== 'off' && materialize !== 'async' && materialize !== 'required') invalidArgument('materialize', "'off', 'async' or 'required'", materialize);
  // A snapshot by name is opened first, before the engine is touched: one that cannot be opened
  // fails here as it always did, unless it may be recovered from.
  let snapshot: Snapshot | undefined;
  let openError: { error: VsnapError; reason: RecoveryReason } | undefined;
  if ('manifest' in source) snapshot = source; // structural: a Snapshot of the other build (ESM/CJS) too
  else {
    try {
      await pullIfMissing(source, client, { signal: options.signal, allowModelSwap: options.allowModelSwap });
      snapshot = await Snapshot.open(source.store, source.name, source.id !== undefined ? { id: source.id } : {});
    } catch (err) {
      const error = toVsnapError(err);
      const reason = recovery === 'reload' ? recoveryReason(error, undefined, undefined, options) : undefined;
      if (!reason) throw error;
      openError = { error, reason };
    }
  }
  const store = snapshot?.store ?? (source as SnapshotRef).store;
  const name = snapshot?.name ?? (source as SnapshotRef).name;
  const found = await engineControl(client, call);
  const control = found.control;
  let status = found.status;
  preflight(status, options);
  // Onto other GPUs: resolved and checked (visible, same kind) before anything changes.
  const onGpus = status.ranks.every((r) => r.memory === 'cuda'); // a host-memory engine is refused without listing GPUs
  const remap = options.onto !== undefined || options.gpuMap !== undefined ? resolveRemap(status, onGpus ? await listDevices() : [], options) : undefined;
  // A deep-suspended engine (found by the driver's state of its pids): restore and unlock every rank first.
  // Before the driver is given the pairs: room on each new GPU for the process and its weights
  // (a remap the driver refuses for memory may leave the process unrestorable: gpu-remap.ts).
  const weights: number[] = [];
  for (const r of status.ranks) weights[r.rank] = Math.max(r.bytes, snapshot?.manifest.data.ranks.find((m) => m.rank === r.rank)?.regions.reduce((n, x) => n + x.size, 0) ?? 0);
  const roomCheck = remap
    ? async () => describeRoom(checkRoom(remap, await listDevices({ freeMemory: true }), weights, options.ontoReserveBytes))
    : undefined;
  const deep = await resumeIfDeep(status, options.checkpointBackend, remap?.pairs, roomCheck);
  if (deep) {
    for (const [step, seconds] of Object.entries(deep)) phases[`deep.${step}`] = seconds;
    lap.restart();
    status = await control.status(call);
  }
  if (!status.sleeping) {
    if (!options.allowModelSwap) {
      throw new VsnapError(
        'E_ENGINE_STATE',
        'the engine is awake: restoring would overwrite a working model. Suspend it first, or pass allowModelSwap to swap models in place.',
      );
    }
    await control.sleep(2, undefined, call);
    lap('sleep');
    status = await control.status(call);
  }
  const rest = tagsAfterWeights(status);
  lap('prepare'); // the engine's status, the snapshot opened, the driver asked whether a rank is checkpointed
  const recover = async (cause: VsnapError, reason: RecoveryReason, manifest: Manifest | undefined): Promise<EngineRestoreReport> => {
    warn(options, `snapshot '${name}' cannot be used (${cause.code}); the engine reloads its weights itself`);
    const outcome = await recoverEngine({
      control, client, store, name, manifest, cause, reason, materialize, call, lap, onWarning: options.onWarning,
      finishWake: (expected) => finishWake(control, client, name, expected, rest, options, call, lap, 'recovered'),
      backToSleep: () => backToSleep(control, !options.beforeKvWake),
      capture: (probe) =>
        captureEngine(store, name, client, {
          ...(probe ? { probePrompt: probe.prompt, probeMaxTokens: probe.maxTokens } : {}),
          ...(options.cache ? { cache: options.cache } : {}),
          ...(options.onWarning ? { onWarning: options.onWarning } : {}),
          ...passOn(options),
        }),
    });
    return { bytes: outcome.bytes, tier: 'engine', seconds: (performance.now() - started) / 1000, phases, path: 'recovered', recovery: outcome.recovery };
  };
  if (openError) {
    if (status.ranks.some((r) => r.reloadWeights === false)) throw openError.error;
    options.resident?.release(client.baseUrl); // what tier 0 held cannot be checked against a snapshot that cannot be read
    return recover(openError.error, openError.reason, undefined);
  }
  snapshot = snapshot!;
  const expected = snapshot.manifest.data.expectedResponse;
  const engineKey = client.baseUrl;
  const resident = options.resident;
  if (resident?.peek(engineKey)) {
    try {
      const held = resident.peek(engineKey)!;
      const usable = held.snapshotId === snapshot.id && status.ranks.every((r) => held.ranks[r.rank]?.pid === r.pid) && status.ranks.every((r) => !r.weightsMapped);
      if (usable) {
        const outcome = await restoreFromResident(control, client, snapshot, resident, rest, options, call, lap);
        if ('report' in outcome) return { ...outcome.report, seconds: (performance.now() - started) / 1000, phases, path: 'restored' };
        status = outcome.status;
      }
    } finally {
      // Tier 0 lets go on every path: after a success the engine holds its weights again; after a
      // failure the snapshot brings them back (or the engine is gone, and so is their use).
      resident.release(engineKey);
    }
  }
  let exported: ExportedRegions | undefined;
  let mapped: MappedRegions | undefined;
  let early: EarlyWake | undefined;
  try {
    if (status.ranks.some((r) => !r.weightsMapped)) await control.wake(['weights'], call);
    lap('wakeWeights');
    exported = await exportRegions(control, status.ranks.length, call);
    lap('export');
    if (remap) checkMoved(exported, remap);
    snapshot.manifest.assertCompatible({ ...liveFacts(status, exported, options.allowModelSwap ?? false), ranks: liveRanks(exported) });
    lap('validate');
    // Mapped once, on a few threads: the hydrate and the GPU digest that verifies it share the
    // mappings (which hold the memory, so the descriptors can go at once).
    mapped = await mapExported(exported, restoreMapping());
    const live = liveRefs(exported, mapped);
    lap('map');
    const twoLinks = options.multipath && exported.ranks.length === 1 ? { multipath: options.multipath } : {};
    if (options.multipath && !('multipath' in twoLinks)) warn(options, `multipath skipped: the engine has ${exported.ranks.length} ranks (each GPU's own link is in use)`);
    // With overlapKvWake the KV cache wakes now; its failure stops the hydrate (and the other way
    // round, the catch below waits for it before the engine goes back to sleep).
    const stop = new AbortController();
    if (options.overlapKvWake) early = startKvWake(control, rest, call, options.beforeKvWake, (e) => stop.abort(e));
    const signal = early ? (call.signal ? AbortSignal.any([call.signal, stop.signal]) : stop.signal) : call.signal;
    // The neighbour tier first (its peer copy takes the exported descriptors), else RAM or the store.
    const neighbour = options.neighbour ? await hydrateFromNeighbour(options.neighbour, snapshot.manifest, liveRefs(exported), live, (m) => warn(options, m), signal) : undefined;
    exported.close();
    const result = neighbour ?? await snapshot.restore({
      regions: live.map((x, i) => ({ key: x.key, size: x.size, tag: exportedTag(exported!, i), rank: x.rank, memory: x.memory })),
      ...twoLinks,
      ...(options.cache ? { cache: options.cache } : {}),
      ...(options.verify ? { verify: options.verify } : {}),
      ...(options.verifyDigests !== undefined ? { verifyDigests: options.verifyDigests } : {}),
      ...passOn({ ...options, ...(signal ? { signal } : {}) }),
      directIo: options.directIo ?? false,
    });
    lap('hydrate');
    if (result.digestSeconds !== undefined) {
      phases.hydrate! -= result.digestSeconds;
      phases.verifyDigests = result.digestSeconds;
    }
    // Unmapping thousands of regions runs off the JS thread while the engine wakes its KV cache.
    const unmapping = mapped.close();
    unmapping.catch(() => undefined);
    await finishWake(control, client, snapshot.name, expected, rest, options, call, lap, 'restored', early, phases);
    await unmapping;
    const gpus = remap ? { gpus: exported.ranks.map((r) => r.deviceUuid) } : {};
    const devices = result.devices ? { devices: result.devices } : {};
    const split = 'multipath' in result && result.multipath ? { multipath: result.multipath } : {};
    const overlapped = early ? { overlapped: Object.keys(early.phases) } : {};
    return { bytes: result.bytes, tier: result.tier ?? 'store', seconds: (performance.now() - started) / 1000, phases, path: 'restored', ...gpus, ...devices, ...split, ...overlapped };
  } catch (err) {
    exported?.close();
    // Before any sleep: a mapping left would keep the engine's freed weights allocated.
    await mapped?.close().catch(() => undefined);
    // A KV wake in flight is waited for: a sleep racing it could leave the KV cache awake.
    await early?.settled;
    let e = toVsnapError(err);
    // The hydrate stopped because the KV wake (or the wait before it) failed: that failure is the cause.
    if (early && e.code === 'E_ABORTED' && !call.signal?.aborted) e = await early.done.then(() => e, (x: unknown) => toVsnapError(x));
    // The snapshot's own faults (never the engine's, nor a cancellation) may be recovered from.
    const reason = recovery === 'reload' && !call.signal?.aborted ? recoveryReason(e, snapshot.manifest, status, options) : undefined;
    if (reason) return recover(e, reason, snapshot.manifest);
    const { state, asleep } = await backToSleep(control, !options.beforeKvWake);
    throw new VsnapError(
      e.code,
      `${e.message}\nRestore of '${snapshot.name}' failed; ${state}. Retry the restore, or wake the engine and reload its weights with vLLM's reload_weights (restoreEngine's recovery: 'reload').`,
      { ...e.details, recovered: asleep },
      { cause: e },
    );
  }
}

/**
 * After a restore onto other GPUs: every rank's export must report the GPU it was sent to (the
 * plugin reads the UUID afresh at each export). The weights' memory is new there, at the same
 * addresses; a rank still on its old GPU (or elsewhere) means the move did not happen as asked.
 */
function checkMoved(exported: ExportedRegions, remap: GpuRemap): void {
  const wrong = exported.ranks.filter((r) => r.deviceUuid !== remap.rankTargets[r.rank]);
  if (wrong.length === 0) return;
  throw new VsnapError(
    'E_ENGINE_STATE',
    `after the restore onto other GPUs, ${wrong.map((r) => `rank ${r.rank} reports GPU ${r.deviceUuid}, not ${remap.rankTargets[r.rank]}`).join('; ')}. ` +
      'Is the vsnap plugin current (it re-reads its GPU at each export)? Check the engine with nvidia-smi before sending it requests.',
    { ranks: wrong.map((r) => r.rank), reported: wrong.map((r) => r.deviceUuid), expected: wrong.map((r) => remap.rankTargets[r.rank]) },
  );
}

/**
 * How a restore maps the engine's regions: pipelined (the copy starts on the first regions while
 * the rest are imported; measured on the H200 the fastest form at every region count, 36 to 4,000:
 * bench/results/2026-12-01-h200-region-count.log), unless VSNAP_REGION_MAPPING says otherwise.
 * @internal
 */
export function restoreMapping(): MappedRegionsOptions {
  return { mapping: defaultMapping('pipelined') };
}

/** The tag of the i-th exported region (rank by rank, in the order sent). */
function exportedTag(exported: ExportedRegions, i: number): string {
  for (const r of exported.ranks) {
    if (i < r.regions.length) return r.regions[i]!.tag;
    i -= r.regions.length;
  }
  throw new RangeError(`exported region ${i}`);
}

/**
 * The tags a restore wakes after the weights: the KV cache, by name, alone. vLLM's executor counts
 * only `weights` and `kv_cache` asleep and skips a whole wake that names any other tag
 * (vllm/v1/executor/abstract.py `wake_up`); other pools come back with any wake (the `cudagraph`
 * pool of --sleep-mode-offload-cudagraph: docs/features/sleep_mode.md).
 */
function tagsAfterWeights(_status: EngineStatus): string[] {
  return ['kv_cache'];
}

/** Wakes the KV cache, resets the prefix cache and checks the expected response. */
async function finishWake(
  control: EngineControl,
  client: EngineClient,
  name: string,
  expected: ExpectedResponse | null,
  rest: readonly string[],
  options: EngineRestoreOptions,
  call: { signal?: AbortSignal },
  lap: (name: string) => void,
  path: 'restored' | 'recovered',
  early?: EarlyWake,
  phases?: Record<string, number>,
): Promise<void> {
  if (early) {
    // Started during the hydrate (overlapKvWake): what is left of it is waited for here.
    await early.done;
    Object.assign(phases!, early.phases);
    lap('wakeKvCacheWait');
  } else {
    if (options.beforeKvWake) {
      await awaitRoom(options.beforeKvWake);
      lap('awaitRoom');
    }
    // The KV cache by name (tagsAfterWeights). Never a wake of all tags: before vLLM PR #52514 that
    // maps the woken weights a second time (vllm/device_allocator/cumem.py `wake_up`), which fails
    // and unmaps them.
    await control.wake(rest, call);
    lap('wakeKvCache');
  }
  await control.resetPrefixCache(call);
  lap('resetPrefixCache');
  if (!expected) return;
  await options.beforeCheck?.();
  const actual = await recheck(client, expected, options.signal);
  lap('expectedResponse');
  const difference = compareResponses(expected, actual, options.logprobTolerance ?? 0);
  if (difference) {
    throw new VsnapError(
      'E_RESPONSE_MISMATCH',
      path === 'restored'
        ? `after restoring '${name}' the engine's answer differs from the one recorded at capture: ${difference}. ` +
          'The weights verified byte for byte, so state outside the snapshot is wrong (an attention backend such as FlashInfer keeps some).'
        : `after the engine reloaded its weights, its answer differs from the one '${name}' recorded at capture: ${difference}. ` +
          'Its checkpoint is not the one the snapshot was taken from (or state outside the weights is wrong).',
      { expected, actual, difference },
    );
  }
}

/** Re-reads the engine after a failed step; an engine that no longer answers ends the restore. */
async function reread(control: EngineControl, call: { signal?: AbortSignal }, what: string, cause: VsnapError): Promise<EngineStatus> {
  try {
    return await control.status(call);
  } catch (err) {
    const e = toVsnapError(err);
    throw new VsnapError(
      e.code,
      `${what} failed (${cause.message}), and the engine no longer answers (${e.message}). Restart it; its snapshot brings the weights back.`,
      { ...e.details, recovered: false },
      { cause: e },
    );
  }
}

/**
 * Tier 0: wakes the weights by mapping back the memory tier 0 held, then finishes the wake.
 * Returns the report, or the engine's re-read status (asleep, weights unmapped) to fall back to
 * the snapshot. An engine whose wake failed is only put back to sleep if it did map weights: a
 * sleep on an engine that never woke is what crashed the reference engine.
 */
async function restoreFromResident(
  control: EngineControl,
  client: EngineClient,
  snapshot: Snapshot,
  resident: ResidentWeights,
  rest: readonly string[],
  options: EngineRestoreOptions,
  call: { signal?: AbortSignal },
  lap: (name: string) => void,
): Promise<{ report: Omit<EngineRestoreReport, 'seconds' | 'phases' | 'path'> } | { status: EngineStatus }> {
  let failure: VsnapError;
  let bytes = 0;
  try {
    ({ bytes } = await resident.adopt(client.baseUrl, (adopt) => control.wake(['weights'], call, adopt), call));
    lap('adoptWeights');
    await finishWake(control, client, snapshot.name, snapshot.manifest.data.expectedResponse, rest, options, call, lap, 'restored');
    return { report: { bytes, tier: 'gpu' } };
  } catch (err) {
    failure = toVsnapError(err);
  }
  if (call.signal?.aborted) throw failure;
  if (failure.code === 'E_ABORTED') {
    // Called off by beforeKvWake (the other engine of a swap did not sleep): no fallback, back to
    // sleep, without waking the KV cache (there is no room for it).
    const { state, asleep } = await backToSleep(control, false);
    throw new VsnapError('E_ABORTED', `${failure.message}\nRestore of '${snapshot.name}' from tier 0 called off; ${state}.`, { ...failure.details, recovered: asleep }, { cause: failure });
  }
  warn(options, `tier-0 wake of '${snapshot.name}' failed (${failure.message}); restoring from the snapshot instead`);
  let status = await reread(control, call, `the tier-0 wake of '${snapshot.name}'`, failure);
  if (holdsWeights(status)) {
    try {
      await sleepAgain(control, status, call, !options.beforeKvWake);
    } catch (err) {
      const e = toVsnapError(err);
      throw new VsnapError(e.code, `the tier-0 wake of '${snapshot.name}' failed (${failure.message}) and putting the engine back to sleep failed too (${e.message}); check it before sending requests`, { ...e.details, recovered: false }, { cause: failure });
    }
    status = await reread(control, call, `the tier-0 wake of '${snapshot.name}'`, failure);
  }
  return { status };
}

