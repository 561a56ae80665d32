import type { HostCache } from '../cache/host-cache.js';
import type { ResidentWeights } from '../cache/resident-weights.js';
import { invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl, type EngineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import type { Mismatch } from '../manifest/compat.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { RegionStore } from '../store/region-store.js';
import { passOn, type TransferOptions } from '../transfer/transfer.js';
import type { MultipathOptions, MultipathStats } from '../transfer/multipath.js';
import { blobProblems, checkSpec, compareResponses, holdsWeights, liveFacts, liveRanks, phaseTimer, preflight, probe, recheck, warn } from './engine-checks.js';
import type { ResponseCheckOptions } from './response-check-options.js';
import { deepPrecheck, deepSuspendRanks, nativeCheckpointBackend, resumeIfDeep, type CheckpointBackend } from './deep-suspend.js';
import { listDevices } from '../gpu/cuda.js';
import { checkRoom, describeRoom, resolveRemap, type GpuRef, type GpuRemap } from './gpu-remap.js';
import { recoverEngine, recoveryReason, type EngineRecovery, type MaterializePolicy, type RecoveryPolicy, type RecoveryReason } from './engine-recovery.js';
import type { Manifest } from '../manifest/manifest.js';
import { checkLive, liveRefs, mapExported, staleError, type LiveCheckReport } from './live-check.js';
import type { MappedRegions, MappedRegionsOptions } from '../regions/mapped.js';
import { Snapshot, type CaptureOptions, type DeviceTiming, type PersistPolicy, type CaptureHash } from './snapshot.js';
import { pullIfMissing, type RegistrySource } from '../registry/source.js';
import { awaitRoom, startKvWake, type EarlyWake } from './kv-overlap.js';
import type { NeighbourTier } from '../gpu/neighbour-tier.js';
import { hydrateFromNeighbour, parkBeforeSleep, type NeighbourParkOptions, type NeighbourParkResult } from './neighbour-flows.js';

/*
 * The engine flows: capture, suspend and restore a running engine. A layer above Snapshot (which
 * knows nothing of engines): this module uses Snapshot, never the other way round.
 */

/**
 * Options of {@link captureEngine}.
 * @public
 */
export interface EngineCaptureOptions extends TransferOptions {
  /** The expected-response check recorded at capture and re-run after every restore (default: a prefill check, one token). */
  readonly check?: ResponseCheckOptions;
  /** Same as `check.prompt` (which wins). */
  readonly probePrompt?: string;
  /** Same as `check.maxTokens` (which wins). */
  readonly probeMaxTokens?: number;
  /** Free-form labels for the manifest. */
  readonly labels?: Readonly<Record<string, string>>;
  /** Checksum granularity (default 64 MiB). */
  readonly chunkSize?: number;
  /** Called with warnings (e.g. an attention backend known to break after sleep). Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
  /** Land the capture in this RAM tier first; see {@link CaptureOptions.cache}. */
  readonly cache?: HostCache;
  /**
   * When the store gets the capture (default `sync`). With `async` or `off`, a suspend that
   * captures first frees the GPU once the weights are in the RAM tier; until the store has them,
   * a crash of this process loses them and the engine must reload its checkpoint.
   */
  readonly persist?: PersistPolicy;
  /** When the chunks' checksums are taken (default `deferred` with persist `async` or `off`); see {@link CaptureHash}. */
  readonly hash?: CaptureHash;
  /** Incremental capture on top of this earlier capture; see {@link CaptureOptions.base}. */
  readonly base?: Snapshot;
}

/**
 * Options of {@link restoreEngine}.
 * @public
 */
export interface EngineRestoreOptions extends TransferOptions {
  /** Restore through the RAM tier. */
  readonly cache?: HostCache;
  /** Tier 0: when it holds this engine's weights for this snapshot, map them back (no bytes move). */
  readonly resident?: ResidentWeights;
  /** See {@link RestoreOptions.verify}. */
  readonly verify?: 'chunk' | 'all-first';
  /** Allow restoring a snapshot of another model with the same layout (same architecture) into a running engine. */
  readonly allowModelSwap?: boolean;
  /** Largest |logprob difference| the expected-response check accepts (default 0: bit-identical). */
  readonly logprobTolerance?: number;
  /** Called with warnings. Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
  /** See {@link RestoreOptions.verifyDigests} (default true). */
  readonly verifyDigests?: boolean;
  /** @internal The process checkpoint calls (tests inject a fake). */
  readonly checkpointBackend?: CheckpointBackend;
  /**
   * A deep-suspended engine on one GPU: restore its process onto this GPU instead (an ordinal
   * in this process, or a UUID), then wake and hydrate its weights there. The GPU must be of
   * the same kind (name and compute capability; else E_INVALID_ARGUMENT before anything
   * changes) and have room for the process and its weights. Needs driver r580+ (else
   * E_CHECKPOINT_UNSUPPORTED, and the engine stays deep-suspended where it was). An engine that
   * is not deep-suspended is refused (E_ENGINE_STATE). See {@link EngineRestoreReport.gpus}.
   */
  readonly onto?: GpuRef;
  /**
   * Like `onto`, for an engine on several GPUs, from each old GPU to its new one (ordinals in this process or
   * UUIDs). The driver is given a whole permutation of the GPUs this process sees (the GPUs
   * displaced take the ones vacated, the others stay), the same for every rank.
   */
  readonly gpuMap?: Readonly<Record<string, GpuRef>>;
  /**
   * With `onto` / `gpuMap`: the GPU memory, in bytes per rank, that the process restore is
   * assumed to need on its new GPU (default 2 GiB: the CUDA context, CUDA-graph pool and other
   * memory still resident after a level-2 sleep; no API reports it). Before any driver call each
   * new GPU must have this plus the rank's weights free, else E_INVALID_ARGUMENT
   * (`details.gpus`: needed and free) and the engine stays deep-suspended where it is.
   */
  readonly ontoReserveBytes?: number;
  /**
   * When the snapshot cannot be used (see {@link RecoveryReason}): `fail` (default) throws its
   * error; `reload` has the engine load its weights again from its own checkpoint (vLLM's
   * level-2 wake with `reload_weights`), checks the expected response where the snapshot's
   * manifest has one, and follows `materialize`. The report says which path ran.
   */
  readonly recovery?: RecoveryPolicy;
  /** After a recovery: capture a new snapshot `off` (default), `async` or `required`; see {@link MaterializePolicy}. */
  readonly materialize?: MaterializePolicy;
  /** @internal Runs after the wake, before the expected-response check (tests flip a weights byte here). */
  readonly beforeCheck?: () => Promise<void>;
  /**
   * Hydrate from the RAM tier over two PCIe links: the engine's GPU's own, and a neighbour GPU's
   * (host → neighbour → peer copy over NVLink), see docs/multipath.md and
   * {@link RestoreOptions.multipath}. Used only where it applies: a restore from the RAM tier of
   * an engine on one GPU (with tensor parallelism every GPU's own link is busy already; a restore
   * from the store or tier 0 ignores it, and `onWarning` says so for an engine with several ranks).
   * The restored memory is still verified by its GPU digests before the engine is woken further.
   */
  readonly multipath?: MultipathOptions;
  /**
   * Wake the KV cache while the hydrate runs, instead of after it (default false; RAM tier and
   * store only). The wake is timed as `wakeKvCache` and listed in
   * {@link EngineRestoreReport.overlapped}. The restore still resolves only once the weights
   * verified, the KV cache woke, the prefix cache was reset and the expected response matched;
   * any failure of either puts the engine back to sleep. The catch: vLLM resumes scheduling as
   * soon as no memory is asleep (vllm/v1/engine/core.py `wake_up`; no tag keeps it paused), so
   * the engine schedules again before the hydrate ends, and a request reaching it then (or one
   * it queued while asleep) would run on half-restored weights. Use it only where nothing sends
   * the engine requests until the restore resolves: the SwapController does, as it leases only
   * awake engines. A tier-0 restore never overlaps: its adopt is the engine's own work, which
   * the engine core runs one call at a time anyway.
   */
  readonly overlapKvWake?: boolean;
  /**
   * @internal Awaited before the KV cache wakes ({@link swapEngines}: the other engine's sleep,
   * which frees the memory the KV cache takes). A rejection fails the restore, and the engine
   * goes back to sleep.
   */
  readonly beforeKvWake?: () => Promise<void>;
  /**
   * The neighbour-GPU tier: when it holds this snapshot's weights (parked by a suspend, under the
   * snapshot's id), they are copied back from the neighbour GPU (peer copy) and verified against
   * the snapshot's GPU digests; the report's tier is `neighbour`. When it does not hold them, or
   * the copy or its check fails (or they are evicted meanwhile), the restore goes on from the RAM
   * tier or the store, with a warning.
   */
  readonly neighbour?: NeighbourTier;
}

/**
 * A snapshot to restore, by name, opened by {@link restoreEngine} itself: so that one that is
 * missing or unreadable can be recovered from (with `recovery: 'reload'`).
 * @public
 */
export interface SnapshotRef {
  /** The store holding it. */
  readonly store: RegionStore;
  /** Its name. */
  readonly name: string;
  /** A capture id (default: the current one). */
  readonly id?: string;
  /**
   * Where to get it when the store does not have it: pulled from this registry reference under
   * `name` first (checked against the engine's facts before any layer moves), then restored; when
   * the store has it, no network. A pull that fails is, for `recovery: 'reload'`, a `missing`
   * snapshot (E_REGISTRY, E_REGISTRY_AUTH, E_SNAPSHOT_NOT_FOUND) or a `damaged` one (E_CHECKSUM).
   */
  readonly from?: RegistrySource;
}

/**
 * Options of {@link suspendEngine}.
 * @public
 */
export interface EngineSuspendOptions {
  /** Capture a snapshot first when none matches (else refuse with E_NOT_RESTORABLE). */
  readonly captureIfNeeded?: boolean;
  /** Re-hash every blob of the matching snapshot before sleeping (default: check they exist with the right sizes). */
  readonly verifyBlobs?: boolean;
  /** vLLM's sleep mode for in-flight requests, where the engine supports it. */
  readonly mode?: 'abort' | 'wait' | 'keep';
  /** Options of the capture, when one is made. */
  readonly capture?: EngineCaptureOptions;
  /** Cancels the operation. */
  readonly signal?: AbortSignal;
  /** Called with warnings. Default: process.emitWarning. */
  readonly onWarning?: (message: string) => void;
  /** Tier 0: keep the weights on the GPU (only the KV cache is freed); the next restore maps them back. */
  readonly resident?: ResidentWeights;
  /**
   * When the live weights differ from the snapshot (the dirty check, by GPU digest, before any
   * discard): `capture` (default) captures again, reading only the changed regions, then
   * suspends; `refuse` fails with E_STALE naming them. A version-1 snapshot (no digests)
   * counts as stale.
   */
  readonly onStale?: 'capture' | 'refuse';
  /**
   * Deep suspend: after the level-2 sleep, lock and then checkpoint every worker process with the
   * driver's process checkpoint API (r570+), so the engine holds no GPU memory at all (its CUDA
   * context, graph pool and NCCL buffers move to host RAM). {@link restoreEngine} brings the
   * processes back first. Fails with E_CHECKPOINT_UNSUPPORTED, before anything changes, where
   * the driver lacks the API. Not with `resident`.
   */
  readonly deep?: boolean;
  /** How long deep suspend waits for each worker to reach a lockable point (default 10 s). */
  readonly lockTimeoutMs?: number;
  /** @internal The process checkpoint calls (tests inject a fake). */
  readonly checkpointBackend?: CheckpointBackend;
  /**
   * Park the weights in a neighbour GPU's tier before the sleep (peer copy from the live weights,
   * verified against the snapshot's GPU digests), for {@link EngineRestoreOptions.neighbour}. A
   * park that cannot be made is skipped with a warning; it never fails the suspend. Not with
   * `resident` (tier 0 keeps the weights where they are).
   */
  readonly neighbour?: NeighbourTier | NeighbourParkOptions;
}

/**
 * What a restore into an engine did, phase by phase.
 * @public
 */
export interface EngineRestoreReport {
  /** Bytes restored. */
  readonly bytes: number;
  /** Where the weights came from: `gpu` (tier 0: mapped back, no copy), `neighbour` (a neighbour GPU's tier, by peer copy), `ram`, `store`, or `engine` (recovered: the engine loaded them). */
  readonly tier: 'gpu' | 'neighbour' | 'ram' | 'store' | 'engine';
  /** Wall time of the whole restore. */
  readonly seconds: number;
  /**
   * Seconds per phase, in order: sleep (model swap only), prepare (the engine's status, the
   * snapshot opened, each rank's checkpoint state read from the driver), then wakeWeights, export, validate
   * (the snapshot's layout and facts checked against the engine's), map (every region mapped
   * once, for the hydrate and its verification), hydrate (or adoptWeights for tier 0), then
   * wakeKvCache, resetPrefixCache, expectedResponse. A deep-suspended engine starts with
   * `deep.restore`, `deep.unlock`. A recovery adds reloadWeights (and materialize, when required).
   */
  readonly phases: Readonly<Record<string, number>>;
  /** `restored` from the snapshot, or `recovered` through the engine's own loader (see `recovery`). */
  readonly path: 'restored' | 'recovered';
  /** What the recovery did, when `path` is `recovered`. */
  readonly recovery?: EngineRecovery;
  /** With `onto` / `gpuMap`: the GPU (UUID) each rank runs on now, in rank order, as its export reported it. */
  readonly gpus?: readonly string[];
  /** Each GPU's share of the hydrate and of the digest check (ram and store tiers; one per rank with tensor parallelism). */
  readonly devices?: readonly DeviceTiming[];
  /** With `multipath`, when the hydrate ran over two links: how its bytes were split. */
  readonly multipath?: MultipathStats;
  /**
   * The phases that ran concurrently with others (absent: none), so the phases add up to more
   * than `seconds`. With `overlapKvWake`: `wakeKvCache` (and `awaitRoom`, the wait for the other
   * engine's sleep in a swap) ran during the hydrate; `wakeKvCacheWait` is the part of the wake
   * the restore still waited for after its hydrate.
   */
  readonly overlapped?: readonly string[];
}

/**
 * What a suspend did.
 * @public
 */
export interface EngineSuspendResult {
  /** The snapshot that can bring the weights back. */
  readonly snapshot: Snapshot;
  /** Whether a capture was made first. */
  readonly captured: boolean;
  /** Whether the engine was already asleep (nothing was done). */
  readonly alreadyAsleep: boolean;
  /** Wall time. */
  readonly seconds: number;
  /**
   * Seconds per phase, in order: status, check (export and the restorability check), capture
   * (when one was made), hold (tier 0), sleep. Empty when the engine was already asleep.
   * `digest` (the dirty check) comes after check when a snapshot was there to compare with.
   * With `deep`: `deep.checkState`, `deep.lock`, `deep.checkpoint` after sleep.
   */
  readonly phases: Readonly<Record<string, number>>;
  /** The dirty check's outcome (absent when there was no snapshot to compare with, or the engine was asleep). */
  readonly liveCheck?: LiveCheckReport;
  /** With `neighbour`: where the weights were parked (absent when they were not). */
  readonly parked?: NeighbourParkResult;
}

/**
 * After a failed restore: reads the engine back and puts it to sleep only if it holds weights (an
 * engine that never woke is left alone). Says what state it is in, and whether it is asleep.
 */
async function backToSleep(control: EngineControl): Promise<{ state: string; asleep: boolean }> {
  let status: EngineStatus;
  try {
    status = await control.status();
  } catch (err) {
    return { state: `the engine no longer answers (${(err as Error).message}); restart it`, asleep: false };
  }
  if (!holdsWeights(status)) return { state: 'the engine is asleep', asleep: true };
  try {
    await control.sleep(2, undefined);
    return { state: 'the engine was put back to sleep', asleep: true };
  } catch (err) {
    return { state: `putting the engine back to sleep failed too (${(err as Error).message}); check it before sending requests`, asleep: false };
  }
}

/**
 * Captures a running engine's weights through its vsnap plugin: records a short greedy
 * completion (the expected response), has every worker export its weights regions, copies them
 * out per rank in parallel, and publishes the snapshot with the engine, model and platform facts.
 * @public
 */
export async function captureEngine(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: EngineCaptureOptions = {},
): Promise<Snapshot> {
  const { control, status } = await engineControl(client, options.signal ? { signal: options.signal } : {});
  preflight(status, options);
  if (status.sleeping) {
    throw new VsnapError('E_ENGINE_STATE', 'the engine is asleep: capture needs its weights awake (restore or wake it first)');
  }
  const exported = await exportRegions(control, status.ranks.length, options.signal ? { signal: options.signal } : {});
  let mapped: MappedRegions | undefined;
  try {
    // Mapped once: the capture's GPU digests and its copy share the mappings.
    mapped = await mapExported(exported);
    return await captureExported(store, name, client, status, exported, options, mapped);
  } finally {
    exported.close();
    await mapped?.close();
  }
}

/** Records the expected response and captures the regions the engine exported (left open). */
async function captureExported(
  store: RegionStore,
  name: string,
  client: EngineClient,
  status: EngineStatus,
  exported: ExportedRegions,
  options: EngineCaptureOptions,
  mapped?: MappedRegions,
): Promise<Snapshot> {
  const expected = await probe(client, checkSpec(options), options.signal);
  const memory = liveRefs(exported, mapped).map((l) => l.memory);
  let i = 0;
  return Snapshot.capture(store, name, {
    regions: exported.ranks.flatMap((r) =>
      r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag, rank: x.rank, memory: memory[i++]!, tensors: x.tensors, ...(x.device !== undefined ? { device: x.device } : {}) })),
    ),
    engine: status.engine,
    model: status.model,
    expectedResponse: expected,
    labels: { ...(options.labels ?? {}) },
    ...(options.chunkSize ? { chunkSize: options.chunkSize } : {}),
    ...(options.cache ? { cache: options.cache } : {}),
    ...(options.persist ? { persist: options.persist } : {}),
    ...(options.hash ? { hash: options.hash } : {}),
    ...(options.base ? { base: options.base } : {}),
    ...passOn(options),
  });
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
      backToSleep: () => backToSleep(control),
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
    const { state, asleep } = await backToSleep(control);
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
 */
function restoreMapping(): MappedRegionsOptions {
  return process.env['VSNAP_REGION_MAPPING'] ? {} : { mapping: 'pipelined' };
}

/** The tag of the i-th exported region (rank by rank, in the order sent). */
function exportedTag(exported: ExportedRegions, i: number): string {
  for (const r of exported.ranks) {
    if (i < r.regions.length) return r.regions[i]!.tag;
    i -= r.regions.length;
  }
  throw new RangeError(`exported region ${i}`);
}

/** The tags a restore wakes after the weights: the KV cache and any other the plugin reports. */
function tagsAfterWeights(status: EngineStatus): string[] {
  const other = status.ranks.flatMap((r) => r.otherTags ?? []).filter((t) => t !== 'weights' && t !== 'kv_cache');
  return ['kv_cache', ...new Set(other)];
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
    // Every tag still asleep, by name: the KV cache, and any other (vLLM 0.33's `cudagraph` pool
    // with --sleep-mode-offload-cudagraph, which a wake of `kv_cache` alone would leave asleep).
    // Never a wake of all tags: before vLLM PR #52514 that maps the woken weights a second time
    // (vllm/device_allocator/cumem.py `wake_up`), which fails and unmaps them.
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
    // Called off by beforeKvWake (the other engine of a swap did not sleep): no fallback, back to sleep.
    const { state, asleep } = await backToSleep(control);
    throw new VsnapError('E_ABORTED', `${failure.message}\nRestore of '${snapshot.name}' from tier 0 called off; ${state}.`, { ...failure.details, recovered: asleep }, { cause: failure });
  }
  warn(options, `tier-0 wake of '${snapshot.name}' failed (${failure.message}); restoring from the snapshot instead`);
  let status = await reread(control, call, `the tier-0 wake of '${snapshot.name}'`, failure);
  if (holdsWeights(status)) {
    try {
      await control.sleep(2, undefined, call);
    } catch (err) {
      const e = toVsnapError(err);
      throw new VsnapError(e.code, `the tier-0 wake of '${snapshot.name}' failed (${failure.message}) and putting the engine back to sleep failed too (${e.message}); check it before sending requests`, { ...e.details, recovered: false }, { cause: failure });
    }
    status = await reread(control, call, `the tier-0 wake of '${snapshot.name}'`, failure);
  }
  return { status };
}

/** Why a snapshot cannot bring back the weights an engine exported, or [] if it can. */
async function restorable(snapshot: Snapshot, status: EngineStatus, exported: ExportedRegions, options: EngineSuspendOptions): Promise<string[]> {
  const mismatches: Mismatch[] = snapshot.manifest.checkCompatibility({ ...liveFacts(status, exported, false), ranks: liveRanks(exported) });
  const problems = [...mismatches.map((m) => m.message), ...blobProblems(snapshot)];
  if (problems.length === 0 && options.verifyBlobs) {
    const report = await snapshot.verify(options.signal ? { signal: options.signal } : {});
    problems.push(...report.problems.map((p) => p.message));
  }
  return problems;
}

/**
 * Whether the store's snapshot `name` could bring this engine's weights back (the check
 * {@link suspendEngine} makes before sleeping), and if not, why.
 * @public
 */
export async function restorableFor(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: { signal?: AbortSignal } = {},
): Promise<{ restorable: boolean; cached: boolean; problems: string[] }> {
  const call = options.signal ? { signal: options.signal } : {};
  const current = await store.current(name);
  if (!current) return { restorable: false, cached: false, problems: [`the store has no snapshot '${name}'`] };
  const snapshot = Snapshot.of(store, current);
  const { control, status } = await engineControl(client, call);
  if (status.sleeping) {
    // Asleep: the layout cannot be read back; the snapshot must at least be whole.
    const problems = blobProblems(snapshot);
    return { restorable: problems.length === 0, cached: true, problems };
  }
  const exported = await exportRegions(control, status.ranks.length, call);
  try {
    const problems = await restorable(snapshot, status, exported, options);
    return { restorable: problems.length === 0, cached: true, problems };
  } finally {
    exported.close();
  }
}

/**
 * Puts an engine to sleep (level 2, freeing its weights) only if this store's snapshot `name`
 * can bring them back: it must match the live layout and engine facts, with every blob
 * present. Otherwise it captures first (`captureIfNeeded`) or refuses with E_NOT_RESTORABLE:
 * weights that cannot come back are never discarded. With `resident`, tier 0 keeps the weights
 * on the GPU and only the KV cache is freed.
 * @public
 */
export async function suspendEngine(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: EngineSuspendOptions = {},
): Promise<EngineSuspendResult> {
  const started = performance.now();
  const phases: Record<string, number> = {};
  const lap = phaseTimer(phases);
  const call = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  const current = await store.current(name);
  if (options.deep && options.resident) invalidArgument('options', 'either deep or resident (tier 0 keeps weights on the GPU)', { deep: true, resident: true });
  const backend = options.deep ? (options.checkpointBackend ?? nativeCheckpointBackend()) : undefined;
  // Deep: the API is there and every worker runs, checked before anything changes.
  const deepRanks = backend ? await deepPrecheck(status, backend) : undefined;
  const goDeep = async (): Promise<void> => {
    for (const [step, seconds] of Object.entries(await deepSuspendRanks(deepRanks!, backend!, options.lockTimeoutMs))) phases[`deep.${step}`] = seconds;
  };
  if (status.sleeping) {
    if (!current) throw new VsnapError('E_NOT_RESTORABLE', `the engine is already asleep and the store has no snapshot '${name}'`, { name });
    if (deepRanks) await goDeep();
    return { snapshot: Snapshot.of(store, current), captured: false, alreadyAsleep: true, seconds: (performance.now() - started) / 1000, phases };
  }
  lap('status');
  preflight(status, options.onWarning ? { onWarning: options.onWarning } : (options.capture ?? {}));
  let snapshot = current ? Snapshot.of(store, current) : undefined;
  // One export serves both the restorability check and tier 0's hold (a capture leaves the memory as it is).
  let exported: ExportedRegions | undefined;
  const exportWeights = async (): Promise<ExportedRegions> => (exported ??= await exportRegions(control, status.ranks.length, call));
  // One mapping serves the dirty check and a capture after it; closed before the sleep frees the memory.
  let mapped: MappedRegions | undefined;
  const mapWeights = async (): Promise<MappedRegions> => (mapped ??= await mapExported(await exportWeights()));
  let captured = false;
  let liveCheck: LiveCheckReport | undefined;
  let parked: NeighbourParkResult | undefined;
  try {
    const problems = snapshot ? await restorable(snapshot, status, await exportWeights(), options) : [`the store has no snapshot '${name}'`];
    lap('check');
    // The dirty check: layout and blobs match, but do the bytes? Changed regions are captured again.
    if (problems.length === 0 && snapshot) {
      liveCheck = await checkLive(snapshot.manifest, liveRefs(await exportWeights(), await mapWeights()));
      lap('digest');
      if (!liveCheck.checked || liveCheck.changed.length) {
        if (options.onStale === 'refuse') throw staleError(name, liveCheck);
        snapshot = await captureExported(store, name, client, status, await exportWeights(), {
          ...(options.capture ?? {}),
          ...(liveCheck.checked ? { base: snapshot } : {}),
          ...(options.signal ? { signal: options.signal } : {}),
        }, await mapWeights());
        captured = true;
        lap('capture');
      }
    }
    if (problems.length) {
      if (!options.captureIfNeeded) {
        throw new VsnapError(
          'E_NOT_RESTORABLE',
          `refusing to suspend: its weights could not be brought back, so they stay on the GPU.\n${problems.map((p) => `  - ${p}`).join('\n')}\n` +
            'Capture a snapshot first (captureEngine), or pass captureIfNeeded.',
          { name, problems },
        );
      }
      // The weights exported for the check (or now) are captured as they are: no second export.
      snapshot = await captureExported(store, name, client, status, await exportWeights(), {
        ...(options.capture ?? {}),
        ...(options.signal ? { signal: options.signal } : {}),
      }, await mapWeights());
      captured = true;
      lap('capture');
    }
    // Tier 0: keep a reference to every weights region, so the sleep frees only the KV cache.
    if (options.resident) {
      await options.resident.hold(client.baseUrl, snapshot!.id, await exportWeights());
      lap('hold');
    } else if (options.neighbour) {
      const park = 'tier' in options.neighbour ? options.neighbour : { tier: options.neighbour };
      parked = await parkBeforeSleep(park, snapshot!.manifest, liveRefs(await exportWeights()), (m) => warn(options, m));
      lap('park');
    }
  } finally {
    exported?.close();
    await mapped?.close();
  }
  try {
    await control.sleep(2, options.mode, call);
    lap('sleep');
  } catch (err) {
    options.resident?.release(client.baseUrl);
    throw err;
  }
  if (deepRanks) await goDeep();
  return { snapshot: snapshot!, captured, alreadyAsleep: false, seconds: (performance.now() - started) / 1000, phases, ...(liveCheck ? { liveCheck } : {}), ...(parked ? { parked } : {}) };
}
