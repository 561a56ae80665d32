import { closeSync, statSync } from 'node:fs';

import type { HostCache } from '../cache/host-cache.js';
import type { ResidentWeights } from '../cache/resident-weights.js';
import { FdReceiver } from '../ipc/fd-receiver.js';
import { toVsnapError, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl, type EngineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import type { LiveLayout, Mismatch } from '../manifest/compat.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { RegionStore } from '../store/region-store.js';
import { passOn, type TransferOptions } from '../transfer/transfer.js';
import type { CaptureOptions, PersistPolicy, Snapshot } from './snapshot.js';
import { checkLive, liveRefs, staleError, type LiveCheckReport } from './live-check.js';

/**
 * Options of {@link Snapshot.captureEngine}.
 * @public
 */
export interface EngineCaptureOptions extends TransferOptions {
  /** Prompt of the expected response recorded at capture (default: "The capital of France is"). */
  readonly probePrompt?: string;
  /** Tokens of the expected response (default 16). */
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
  /** Incremental capture on top of this earlier capture; see {@link CaptureOptions.base}. */
  readonly base?: Snapshot;
}

/**
 * Options of {@link Snapshot.restoreEngine}.
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
}

/**
 * Options of {@link Snapshot.suspendEngine}.
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
}

/**
 * What a restore into an engine did, phase by phase.
 * @public
 */
export interface EngineRestoreReport {
  /** Bytes restored. */
  readonly bytes: number;
  /** Where the weights came from: `gpu` (tier 0: mapped back, no copy), `ram` or `store`. */
  readonly tier: 'gpu' | 'ram' | 'store';
  /** Wall time of the whole restore. */
  readonly seconds: number;
  /**
   * Seconds per phase, in order: sleep (model swap only), then wakeWeights, export, hydrate (or
   * adoptWeights for tier 0), then wakeKvCache, resetPrefixCache, expectedResponse.
   */
  readonly phases: Readonly<Record<string, number>>;
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
   */
  readonly phases: Readonly<Record<string, number>>;
  /** The dirty check's outcome (absent when there was no snapshot to compare with, or the engine was asleep). */
  readonly liveCheck?: LiveCheckReport;
}

const DEFAULT_PROMPT = 'The capital of France is';
const RISKY_BACKENDS = /FLASHINFER/i;

function warn(options: { onWarning?: (m: string) => void }, message: string): void {
  if (options.onWarning) options.onWarning(message);
  else process.emitWarning(message, { code: 'VSNAP_ENGINE' });
}

function preflight(status: EngineStatus, options: { onWarning?: (m: string) => void }): void {
  const backend = status.engine.attentionBackend;
  if (backend && RISKY_BACKENDS.test(backend)) {
    warn(
      options,
      `the engine uses the ${backend} attention backend, which keeps workspace outside the sleep-mode allocator: ` +
        'after a wake its output can be fluent but wrong (vllm #31016). Serve with --attention-backend TRITON_ATTN; ' +
        'the expected-response check after each restore will catch the fault.',
    );
  }
  const off = status.ranks.filter((r) => !r.sleepMode);
  if (off.length) {
    throw new VsnapError('E_ENGINE_STATE', 'the engine runs without sleep mode: start it with --enable-sleep-mode', { ranks: off.map((r) => r.rank) });
  }
}

/** The engine, model and platform facts a snapshot must match. */
function liveFacts(status: EngineStatus, exported: ExportedRegions, allowModelSwap: boolean): Omit<LiveLayout, 'ranks'> {
  const m = status.model;
  const model = allowModelSwap
    ? { dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize }
    : { id: m.id, revision: m.revision, dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize };
  const engine = { kind: status.engine.kind, version: status.engine.version, pluginVersion: status.engine.pluginVersion, attentionBackend: status.engine.attentionBackend };
  const first = exported.ranks[0]!;
  if (first.memory === 'host') return { engine, model, platform: { kind: 'host' } };
  const device = first.gpu; // found by the export
  return {
    engine,
    model,
    platform: { kind: 'cuda', gpuName: device?.name ?? null, computeCapability: device?.computeCapability ?? null, vmmGranularity: device?.vmmGranularity ?? null },
  };
}

function liveRanks(exported: ExportedRegions): LiveLayout['ranks'] {
  return exported.ranks.map((r) => ({ regions: r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag })) }));
}

/** Records the engine's greedy answer to the probe prompt. */
export async function probe(client: EngineClient, prompt: string, maxTokens: number, signal?: AbortSignal): Promise<ExpectedResponse> {
  const r = await client.completions({ prompt, max_tokens: maxTokens, temperature: 0, logprobs: 1 }, signal ? { signal } : {});
  return { prompt, maxTokens, tokenIds: r.tokenIds ?? [], text: r.text, logprobs: r.logprobs };
}

function compareResponses(expected: ExpectedResponse, actual: ExpectedResponse, tolerance: number): string | undefined {
  if (expected.tokenIds.length && actual.tokenIds.length) {
    const i = expected.tokenIds.findIndex((t, k) => actual.tokenIds[k] !== t);
    if (i >= 0 || expected.tokenIds.length !== actual.tokenIds.length) {
      const at = i >= 0 ? i : Math.min(expected.tokenIds.length, actual.tokenIds.length);
      return `token ${at} differs: expected ${expected.tokenIds[at]}, got ${actual.tokenIds[at]}`;
    }
  } else if (expected.text !== actual.text) {
    return `text differs: expected ${JSON.stringify(expected.text.slice(0, 80))}, got ${JSON.stringify(actual.text.slice(0, 80))}`;
  }
  if (expected.logprobs && actual.logprobs) {
    let worst = 0;
    expected.logprobs.forEach((lp, k) => {
      worst = Math.max(worst, Math.abs(lp - (actual.logprobs![k] ?? Number.NaN)));
    });
    if (!(worst <= tolerance)) return `logprobs differ by up to ${worst} (tolerance ${tolerance})`;
  }
  return undefined;
}

async function putToSleep(control: EngineControl): Promise<string> {
  try {
    await control.sleep(2, undefined);
    return 'the engine was put back to sleep';
  } catch (err) {
    return `putting the engine back to sleep failed too (${(err as Error).message}); check it before sending requests`;
  }
}

/** @internal */
export async function captureEngine(
  SnapshotClass: typeof Snapshot,
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: EngineCaptureOptions,
): Promise<Snapshot> {
  const { control, status } = await engineControl(client, options.signal ? { signal: options.signal } : {});
  preflight(status, options);
  if (status.sleeping) {
    throw new VsnapError('E_ENGINE_STATE', 'the engine is asleep: capture needs its weights awake (restore or wake it first)');
  }
  const exported = await exportRegions(control, status.ranks.length, options.signal ? { signal: options.signal } : {});
  try {
    return await captureExported(SnapshotClass, store, name, client, status, exported, options);
  } finally {
    exported.close();
  }
}

/** Records the expected response and captures the regions the engine exported (left open). */
async function captureExported(
  SnapshotClass: typeof Snapshot,
  store: RegionStore,
  name: string,
  client: EngineClient,
  status: EngineStatus,
  exported: ExportedRegions,
  options: EngineCaptureOptions,
): Promise<Snapshot> {
  const expected = await probe(client, options.probePrompt ?? DEFAULT_PROMPT, options.probeMaxTokens ?? 16, options.signal);
  return SnapshotClass.capture(store, name, {
    regions: exported.ranks.flatMap((r) =>
      r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag, rank: x.rank, memory: x.memory, tensors: x.tensors, ...(x.device !== undefined ? { device: x.device } : {}) })),
    ),
    engine: status.engine,
    model: status.model,
    expectedResponse: expected,
    labels: { ...(options.labels ?? {}) },
    ...(options.chunkSize ? { chunkSize: options.chunkSize } : {}),
    ...(options.cache ? { cache: options.cache } : {}),
    ...(options.persist ? { persist: options.persist } : {}),
    ...(options.base ? { base: options.base } : {}),
    ...passOn(options),
  });
}

/** @internal */
export async function restoreEngine(snapshot: Snapshot, client: EngineClient, options: EngineRestoreOptions): Promise<EngineRestoreReport> {
  const started = performance.now();
  const phases: Record<string, number> = {};
  let mark = performance.now();
  const lap = (name: string): void => {
    const now = performance.now();
    phases[name] = (now - mark) / 1000;
    mark = now;
  };
  const call = options.signal ? { signal: options.signal } : {};
  const expected = snapshot.manifest.data.expectedResponse;
  const found = await engineControl(client, call);
  const control = found.control;
  let status = found.status;
  preflight(status, options);
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
  const engineKey = client.baseUrl;
  const held = options.resident?.peek(engineKey);
  if (held && options.resident) {
    const usable = held.snapshotId === snapshot.id && status.ranks.every((r) => held.ranks[r.rank]?.pid === r.pid) && status.ranks.every((r) => !r.weightsMapped);
    if (usable) {
      try {
        const report = await adoptResident(control, held, call);
        lap('adoptWeights');
        await finishWake(control, client, snapshot, expected, options, call, lap);
        options.resident.release(engineKey); // the engine holds its weights again
        return { bytes: report.bytes, tier: 'gpu', seconds: (performance.now() - started) / 1000, phases };
      } catch (err) {
        // Put the engine back to sleep and fall back to the snapshot below.
        warn(options, `tier-0 wake of '${snapshot.name}' failed (${(err as Error).message}); restoring from the snapshot instead`);
        await putToSleep(control);
        status = await control.status(call);
      }
    }
    options.resident.release(engineKey);
  }
  if (status.ranks.some((r) => !r.weightsMapped)) await control.wake(['weights'], call);
  lap('wakeWeights');
  let exported: ExportedRegions | undefined;
  try {
    exported = await exportRegions(control, status.ranks.length, call);
    lap('export');
    snapshot.manifest.assertCompatible({ ...liveFacts(status, exported, options.allowModelSwap ?? false), ranks: liveRanks(exported) });
    const result = await snapshot.restore({
      regions: exported.ranks.flatMap((r) => r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag, rank: x.rank, memory: x.memory }))),
      ...(options.cache ? { cache: options.cache } : {}),
      ...(options.verify ? { verify: options.verify } : {}),
      ...(options.verifyDigests !== undefined ? { verifyDigests: options.verifyDigests } : {}),
      ...passOn(options),
      directIo: options.directIo ?? false,
    });
    lap('hydrate');
    if (result.digestSeconds !== undefined) {
      phases.hydrate! -= result.digestSeconds;
      phases.verifyDigests = result.digestSeconds;
    }
    exported.close();
    await finishWake(control, client, snapshot, expected, options, call, lap);
    return { bytes: result.bytes, tier: result.tier ?? 'store', seconds: (performance.now() - started) / 1000, phases };
  } catch (err) {
    exported?.close();
    const e = toVsnapError(err);
    const state = await putToSleep(control);
    throw new VsnapError(
      e.code,
      `${e.message}\nRestore of '${snapshot.name}' failed; ${state}. Retry the restore, or wake the engine and reload its weights with vLLM's reload_weights.`,
      { ...e.details, recovered: state.startsWith('the engine was put back') },
      { cause: e },
    );
  }
}

/** Wakes the KV cache, resets the prefix cache and checks the expected response. */
async function finishWake(
  control: EngineControl,
  client: EngineClient,
  snapshot: Snapshot,
  expected: ExpectedResponse | null,
  options: EngineRestoreOptions,
  call: { signal?: AbortSignal },
  lap: (name: string) => void,
): Promise<void> {
  await control.wake(['kv_cache'], call);
  lap('wakeKvCache');
  await control.resetPrefixCache(call);
  lap('resetPrefixCache');
  if (!expected) return;
  const actual = await probe(client, expected.prompt, expected.maxTokens, options.signal);
  lap('expectedResponse');
  const difference = compareResponses(expected, actual, options.logprobTolerance ?? 0);
  if (difference) {
    throw new VsnapError(
      'E_RESPONSE_MISMATCH',
      `after restoring '${snapshot.name}' the engine's answer differs from the one recorded at capture: ${difference}. ` +
        'The weights verified byte for byte, so state outside the snapshot is wrong (an attention backend such as FlashInfer keeps some).',
      { expected, actual, difference },
    );
  }
}

/** Tier 0: offers each rank its held descriptors and wakes the weights mapping them back. */
async function adoptResident(control: EngineControl, held: NonNullable<ReturnType<ResidentWeights['peek']>>, call: { signal?: AbortSignal }): Promise<{ bytes: number }> {
  const receiver = await FdReceiver.listen();
  try {
    const offers = held.ranks.map((r) => receiver.offer({ regions: r.regions }, r.fds, { timeoutMs: 120_000, ...(call.signal ? { signal: call.signal } : {}) }));
    const taken = Promise.all(offers.map((o) => o.taken));
    await control.wake(['weights'], call, { socket: receiver.path, nonces: offers.map((o) => o.nonce) });
    for (const m of await taken) for (const fd of m.fds) closeSync(fd);
    return { bytes: held.bytes };
  } finally {
    receiver.close();
  }
}

/** The snapshot's blobs that are missing or of the wrong size, as problems. */
function blobProblems(snapshot: Snapshot): string[] {
  const problems: string[] = [];
  for (const { region } of snapshot.manifest.regions()) {
    let size: number | undefined;
    try {
      size = statSync(snapshot.store.blobPath(region.blob)).size;
    } catch {
      size = undefined;
    }
    if (size !== region.size) problems.push(`blob of region ${JSON.stringify(region.key)} is ${size === undefined ? 'missing' : `${size} bytes, not ${region.size}`}`);
  }
  return problems;
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

/** @internal */
export async function restorableFor(
  SnapshotClass: typeof Snapshot,
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: { signal?: AbortSignal } = {},
): Promise<{ restorable: boolean; cached: boolean; problems: string[] }> {
  const call = options.signal ? { signal: options.signal } : {};
  const current = await store.current(name);
  if (!current) return { restorable: false, cached: false, problems: [`the store has no snapshot '${name}'`] };
  const snapshot = SnapshotClass.of(store, current);
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

/** @internal */
export async function suspendEngine(
  SnapshotClass: typeof Snapshot,
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: EngineSuspendOptions,
): Promise<EngineSuspendResult> {
  const started = performance.now();
  const phases: Record<string, number> = {};
  let mark = started;
  const lap = (phase: string): void => {
    const now = performance.now();
    phases[phase] = (now - mark) / 1000;
    mark = now;
  };
  const call = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  const current = await store.current(name);
  if (status.sleeping) {
    if (!current) throw new VsnapError('E_NOT_RESTORABLE', `the engine is already asleep and the store has no snapshot '${name}'`, { name });
    return { snapshot: SnapshotClass.of(store, current), captured: false, alreadyAsleep: true, seconds: (performance.now() - started) / 1000, phases: {} };
  }
  lap('status');
  preflight(status, options.onWarning ? { onWarning: options.onWarning } : (options.capture ?? {}));
  let snapshot = current ? SnapshotClass.of(store, current) : undefined;
  // One export serves both the restorability check and tier 0's hold (a capture leaves the memory as it is).
  let exported: ExportedRegions | undefined;
  const exportWeights = async (): Promise<ExportedRegions> => (exported ??= await exportRegions(control, status.ranks.length, call));
  let captured = false;
  let liveCheck: LiveCheckReport | undefined;
  try {
    const problems = snapshot ? await restorable(snapshot, status, await exportWeights(), options) : [`the store has no snapshot '${name}'`];
    lap('check');
    // The dirty check: layout and blobs match, but do the bytes? Changed regions are captured again.
    if (problems.length === 0 && snapshot) {
      liveCheck = await checkLive(snapshot.manifest, liveRefs(await exportWeights()));
      lap('digest');
      if (!liveCheck.checked || liveCheck.changed.length) {
        if (options.onStale === 'refuse') throw staleError(name, liveCheck);
        snapshot = await captureExported(SnapshotClass, store, name, client, status, await exportWeights(), {
          ...(options.capture ?? {}),
          ...(liveCheck.checked ? { base: snapshot } : {}),
          ...(options.signal ? { signal: options.signal } : {}),
        });
        captured = true;
        lap('capture');
      }
    }
    if (problems.length) {
      if (!options.captureIfNeeded) {
        throw new VsnapError(
          'E_NOT_RESTORABLE',
          `refusing to suspend: its weights could not be brought back, so they stay on the GPU.\n${problems.map((p) => `  - ${p}`).join('\n')}\n` +
            'Capture a snapshot first (Snapshot.captureEngine), or pass captureIfNeeded.',
          { name, problems },
        );
      }
      // The weights exported for the check (or now) are captured as they are: no second export.
      snapshot = await captureExported(SnapshotClass, store, name, client, status, await exportWeights(), {
        ...(options.capture ?? {}),
        ...(options.signal ? { signal: options.signal } : {}),
      });
      captured = true;
      lap('capture');
    }
    // Tier 0: keep a reference to every weights region, so the sleep frees only the KV cache.
    if (options.resident) {
      await options.resident.hold(client.baseUrl, snapshot!.id, await exportWeights());
      lap('hold');
    }
  } finally {
    exported?.close();
  }
  try {
    await control.sleep(2, options.mode, call);
    lap('sleep');
  } catch (err) {
    options.resident?.release(client.baseUrl);
    throw err;
  }
  return { snapshot: snapshot!, captured, alreadyAsleep: false, seconds: (performance.now() - started) / 1000, phases, ...(liveCheck ? { liveCheck } : {}) };
}
