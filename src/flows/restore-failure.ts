import { VsnapError, type ErrorCode } from '../errors.js';

/*
 * Where a failed restore left its engine, as a typed record kept with the error it threw (the
 * SwapController steers on it); users read the same facts in the error's details.
 */

/**
 * Why a snapshot could not be used, for the errors recovery goes past:
 * - `missing`: no snapshot of that name (E_SNAPSHOT_NOT_FOUND), or a blob is gone (E_BLOB_MISSING),
 *   or a snapshot to pull (a `SnapshotRef` with `from`) cannot be had: the registry does not
 *   have it (E_SNAPSHOT_NOT_FOUND), cannot be reached or fails (E_REGISTRY), stalls or trickles
 *   (E_REGISTRY_TIMEOUT), or refuses the credentials (E_REGISTRY_AUTH; the report's `code` says so);
 * - `damaged`: E_CHECKSUM, E_BLOB_TRUNCATED, E_CODEC_CORRUPT, E_DIGEST_MISMATCH, or an unreadable manifest (E_MANIFEST_INVALID);
 * - `incompatible`: E_MANIFEST_MISMATCH for the same model (layout, engine version, platform);
 * - `not-durable`: a capture kept only in the RAM tier is no longer there (E_NOT_DURABLE).
 *
 * Never recovered: a snapshot of another model (the engine would load its own model, not the one
 * asked for), and every error that is not about the snapshot: the engine's (E_ENGINE_*), a
 * cancellation, an expected-response mismatch after a verified restore, E_STALE.
 * @public
 */
export type RecoveryReason = 'missing' | 'damaged' | 'incompatible' | 'not-durable';

/** Where a failed restore, past its first steps, left the engine. @internal */
export interface RestoreFailure {
  /** Asleep with its weights let go (true), or it could not be put back to sleep and must not serve (false). */
  readonly engineAsleep: boolean;
  /** A recovery through the engine's own loader was tried, for this reason, and failed. */
  readonly recovery?: RecoveryReason;
  /** With `recovery`: the snapshot's own error, which the recovery tried to go past. */
  readonly snapshotError?: ErrorCode;
}

const failures = new WeakMap<VsnapError, RestoreFailure>();

/**
 * The error of a failed restore: its details carry the failure (`recovered`, `recovery`,
 * `snapshotError`), and {@link restoreFailure} gives it back typed.
 * @internal
 */
export function restoreError(code: ErrorCode, message: string, details: Readonly<Record<string, unknown>>, cause: unknown, failure: RestoreFailure): VsnapError {
  const extra = { recovered: failure.engineAsleep, ...(failure.recovery ? { recovery: failure.recovery } : {}), ...(failure.snapshotError ? { snapshotError: failure.snapshotError } : {}) };
  const error = new VsnapError(code, message, { ...details, ...extra }, { cause });
  failures.set(error, failure);
  return error;
}

/** Where the restore that threw `error` left its engine; undefined where it failed before touching it (opening, reading, preparing it). @internal */
export function restoreFailure(error: VsnapError): RestoreFailure | undefined {
  return failures.get(error);
}
