import { toVsnapError, VsnapError, type ErrorCode } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import type { Manifest } from '../manifest/manifest.js';
import type { ExpectedResponse } from '../manifest/types.js';
import type { RegionStore } from '../store/region-store.js';
import { warn } from './checks.js';
import { restoreError, type RecoveryReason } from './restore-failure.js';
import type { Snapshot } from '../snapshot/snapshot.js';

/*
 * Recovery through the engine's own loader: when a restore cannot use its snapshot, the engine
 * loads its weights again from its checkpoint, as vLLM documents the level-2 wake
 * (docs/features/sleep_mode.md: wake_up(tags=["weights"]), collective_rpc("reload_weights"),
 * wake_up(tags=["kv_cache"]); Worker.reload_weights in vllm/v1/worker/gpu_worker.py has the
 * model runner's loader read the checkpoint into the parameters where they are).
 */

/**
 * What {@link restoreEngine} does when its snapshot cannot be used: `fail` (default) throws the
 * snapshot's error; `reload` has the engine load its weights again from its own checkpoint (see
 * {@link RecoveryReason} for which errors qualify).
 * @public
 */
export type RecoveryPolicy = 'fail' | 'reload';

/**
 * After a recovery, whether a new snapshot is captured: `off` (none), `async` (in the background
 * while the engine serves; see {@link EngineRecovery.materialized}), `required` (captured and its
 * blobs verified before the restore resolves).
 * @public
 */
export type MaterializePolicy = 'off' | 'async' | 'required';

export type { RecoveryReason } from './restore-failure.js';

/**
 * How a background capture after a recovery ended (the promise never rejects).
 * @public
 */
export type MaterializeOutcome = { readonly ok: true; readonly snapshot: Snapshot } | { readonly ok: false; readonly error: VsnapError };

/**
 * What a recovery did, in {@link EngineRestoreReport.recovery}.
 * @public
 */
export interface EngineRecovery {
  /** Why the snapshot could not be used. */
  readonly reason: RecoveryReason;
  /** The snapshot's error code. */
  readonly code: ErrorCode;
  /** The snapshot's error message. */
  readonly message: string;
  /** `matched`: the engine's answer equals the snapshot's expected response; `unchecked`: there was none to compare with. */
  readonly expectedResponse: 'matched' | 'unchecked';
  /** Why the expected-response check could not run, when `unchecked`. */
  readonly uncheckedReason?: string;
  /** The materialize policy followed. */
  readonly materialize: MaterializePolicy;
  /** `required`: the new snapshot, captured and verified. */
  readonly snapshot?: Snapshot;
  /** `async`: settles when the background capture is published (or failed; failures are also passed to onWarning). */
  readonly materialized?: Promise<MaterializeOutcome>;
}

const REASONS: Partial<Record<ErrorCode, RecoveryReason>> = {
  E_SNAPSHOT_NOT_FOUND: 'missing',
  E_BLOB_MISSING: 'missing',
  E_CHECKSUM: 'damaged',
  E_BLOB_TRUNCATED: 'damaged',
  E_CODEC_CORRUPT: 'damaged', // a coded chunk that does not decode: as damaged as a bad checksum
  E_DIGEST_MISMATCH: 'damaged',
  E_MANIFEST_INVALID: 'damaged',
  E_MANIFEST_MISMATCH: 'incompatible',
  E_NOT_DURABLE: 'not-durable',
  E_REGISTRY: 'missing', // only a pull raises these in a restore
  E_REGISTRY_AUTH: 'missing',
  E_REGISTRY_TIMEOUT: 'missing',
};

/**
 * Whether a restore's error may be recovered by reloading, and why; undefined when not.
 * `manifest`: the snapshot's, when it could be read. The engine must hold the model the snapshot
 * is of (a reload loads the engine's own model), and no worker may lack reload_weights.
 * @internal
 */
export function recoveryReason(
  err: VsnapError,
  manifest: Manifest | undefined,
  status: EngineStatus | undefined,
  options: { allowModelSwap?: boolean | undefined },
): RecoveryReason | undefined {
  const reason = REASONS[err.code];
  if (!reason) return undefined;
  if (status?.ranks.some((r) => r.reloadWeights === false)) return undefined;
  // A pull refused before any layer because the artifact is of another model: nothing to reload.
  if (err.code === 'E_MANIFEST_MISMATCH' && ((err.details.mismatches ?? []) as Array<{ path?: string }>).some((m) => m.path === 'model.id' || m.path === 'model.revision')) return undefined;
  if (!manifest) return options.allowModelSwap ? undefined : reason; // a model swap to an unknown model: nothing to reload
  const wanted = manifest.data.model;
  if (!wanted) return options.allowModelSwap ? undefined : reason; // no model recorded: as for an unreadable manifest
  if (status && (wanted.id !== status.model.id || (wanted.revision !== null && status.model.revision !== null && wanted.revision !== status.model.revision))) return undefined;
  return reason;
}

/** The snapshot's expected response, when it is of this very model; else why not. @internal */
export function expectedFor(manifest: Manifest | undefined, status: EngineStatus): { response: ExpectedResponse | null; why?: string } {
  if (!manifest) return { response: null, why: 'the snapshot manifest could not be read' };
  const response = manifest.data.expectedResponse;
  if (!response) return { response: null, why: 'the snapshot has no expected response' };
  const m = manifest.data.model;
  const live = status.model;
  if (!m) return { response: null, why: 'the snapshot records no model to compare with' };
  if (m.dtype !== live.dtype || m.quantization !== live.quantization || m.tensorParallelSize !== live.tensorParallelSize || m.pipelineParallelSize !== live.pipelineParallelSize) {
    return { response: null, why: 'the snapshot was taken with another dtype, quantization or parallel layout' };
  }
  return { response };
}

/** What recoverEngine needs from the engine flows (passed in, so this module does not import them). @internal */
export interface RecoveryContext {
  readonly control: EngineControl;
  readonly client: EngineClient;
  readonly store: RegionStore;
  readonly name: string;
  readonly manifest: Manifest | undefined;
  readonly cause: VsnapError;
  readonly reason: RecoveryReason;
  readonly materialize: MaterializePolicy;
  readonly call: { signal?: AbortSignal };
  readonly lap: (phase: 'wakeWeights' | 'reloadWeights' | 'materialize') => void;
  readonly onWarning?: ((message: string) => void) | undefined;
  readonly finishWake: (expected: ExpectedResponse | null) => Promise<void>;
  readonly backToSleep: () => Promise<{ state: string; asleep: boolean }>;
  readonly capture: (probe: ExpectedResponse | null) => Promise<Snapshot>;
}

/**
 * Wakes the weights (if not yet), has the engine reload them, finishes the wake with the
 * expected-response check where there is one, then follows the materialize policy. Any failure
 * before the engine is reported ready puts it back to sleep and says so.
 * @internal
 */
export async function recoverEngine(ctx: RecoveryContext): Promise<{ recovery: EngineRecovery; bytes: number }> {
  const { control, call, lap } = ctx;
  let stage = 'the reload of its weights';
  let recovery: EngineRecovery;
  let bytes = 0;
  try {
    const status = await control.status(call);
    bytes = status.ranks.reduce((n, r) => n + ((r as { bytes?: number }).bytes ?? 0), 0);
    if (status.ranks.some((r) => !r.weightsMapped)) await control.wake(['weights'], call);
    lap('wakeWeights');
    await control.reloadWeights(call);
    lap('reloadWeights');
    stage = 'the wake after the reload';
    const expected = expectedFor(ctx.manifest, status);
    await ctx.finishWake(expected.response);
    const base = {
      reason: ctx.reason,
      code: ctx.cause.code,
      message: ctx.cause.message,
      expectedResponse: expected.response ? ('matched' as const) : ('unchecked' as const),
      ...(expected.why ? { uncheckedReason: expected.why } : {}),
      materialize: ctx.materialize,
    };
    if (ctx.materialize === 'required') {
      stage = 'the required capture of a new snapshot';
      const snapshot = await captureVerified(ctx, expected.response);
      lap('materialize');
      recovery = { ...base, snapshot };
    } else if (ctx.materialize === 'async') {
      const materialized = captureVerified(ctx, expected.response).then(
        (snapshot): MaterializeOutcome => ({ ok: true, snapshot }),
        (err: unknown): MaterializeOutcome => {
          const error = toVsnapError(err);
          warn({ onWarning: ctx.onWarning }, `after recovering '${ctx.name}', capturing a new snapshot failed (${error.code}): ${error.message}`);
          return { ok: false, error };
        },
      );
      recovery = { ...base, materialized };
    } else {
      recovery = base;
    }
  } catch (err) {
    const e = toVsnapError(err);
    const { state, asleep } = await ctx.backToSleep();
    throw restoreError(
      e.code,
      `snapshot '${ctx.name}' could not be used (${ctx.cause.code}), and recovery through the engine's own loader failed in ${stage}: ${e.message}\n` +
        `${state}. Check the engine (its log says why the load failed), then retry, or restart it.`,
      e.details,
      e,
      { engineAsleep: asleep, recovery: ctx.reason, snapshotError: ctx.cause.code },
    );
  }
  return { recovery, bytes };
}

/** Captures a new snapshot of the recovered engine and re-reads its blobs from the store. */
async function captureVerified(ctx: RecoveryContext, probe: ExpectedResponse | null): Promise<Snapshot> {
  const snapshot = await ctx.capture(probe);
  if (!snapshot.durable) return snapshot; // a RAM-tier-only capture: its GPU digests check every restore from RAM
  const report = await snapshot.verify(ctx.call.signal ? { signal: ctx.call.signal } : {});
  if (!report.ok) {
    throw new VsnapError('E_CHECKSUM', `the new capture ${snapshot.id} of '${ctx.name}' failed verification: ${report.problems.map((p) => p.message).join('; ')}`, {
      problems: report.problems,
    });
  }
  return snapshot;
}
