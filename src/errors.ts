/**
 * Every error vsnap throws is a {@link VsnapError} with a stable {@link ErrorCode}: match on
 * `err.code`, not on the message. The message says what happened and what to do.
 */

/**
 * The stable error codes.
 * @public
 */
export type ErrorCode =
  /** An argument or option is malformed or out of range. */
  | 'E_INVALID_ARGUMENT'
  /** A name (snapshot, region key) is empty, too long, or could escape its directory. */
  | 'E_INVALID_NAME'
  /** The native addon could not be loaded; the message lists every attempt. */
  | 'E_NATIVE_LOAD'
  /** No usable CUDA driver or device; `details.reason` says why. */
  | 'E_CUDA_UNAVAILABLE'
  /** A CUDA driver call failed; `details.call` and `details.cudaError` name it. */
  | 'E_CUDA'
  /** A file system call failed; `details.path` and `details.errno` say where. */
  | 'E_IO'
  /** Not enough free space for the work asked for. */
  | 'E_NO_SPACE'
  /** A chunk's bytes do not hash to the manifest's checksum; nothing of it was copied. */
  | 'E_CHECKSUM'
  /** A blob is shorter or longer than its manifest says. */
  | 'E_BLOB_TRUNCATED'
  /** A blob a manifest references is missing from the store. */
  | 'E_BLOB_MISSING'
  /** A manifest failed schema validation; `details.issues` lists each problem with its path. */
  | 'E_MANIFEST_INVALID'
  /** A snapshot does not fit the live layout; `details.mismatches` lists every difference. */
  | 'E_MANIFEST_MISMATCH'
  /** No snapshot of that name (or id) in the store. */
  | 'E_SNAPSHOT_NOT_FOUND'
  /** A capture kept only in the RAM tier (persist `async` or `off`) is no longer there and was never persisted. */
  | 'E_NOT_DURABLE'
  /** The directory is not a vsnap store (or a newer format). */
  | 'E_STORE_INVALID'
  /** The store's layout has a symbolic link (or another foreign entry) where vsnap keeps its own files; vsnap never follows it. `details.path` names it. */
  | 'E_STORE_UNSAFE'
  /** Another process held the store lock for longer than the timeout. */
  | 'E_STORE_LOCKED'
  /** The operation was cancelled through its AbortSignal. */
  | 'E_ABORTED'
  /** A timeout expired. */
  | 'E_TIMEOUT'
  /** The object was closed and can no longer be used. */
  | 'E_CLOSED'
  /** An offset or length falls outside a region or allocation. */
  | 'E_OUT_OF_RANGE'
  /** A descriptor-passing peer broke the protocol. */
  | 'E_IPC_PROTOCOL'
  /** A descriptor-passing peer failed authentication (uid or nonce). */
  | 'E_IPC_AUTH'
  /** Something is already listening on that socket path. */
  | 'E_ADDRESS_IN_USE'
  /** The engine answered an HTTP error; `details` has status, route and a body excerpt. */
  | 'E_ENGINE_HTTP'
  /** The engine could not be reached (connection refused, reset, DNS). */
  | 'E_ENGINE_UNREACHABLE'
  /** The engine answered something of an unexpected shape. */
  | 'E_ENGINE_PROTOCOL'
  /** The engine is not in a state the operation can start from (e.g. capture while asleep). */
  | 'E_ENGINE_STATE'
  /** Suspend refused: no verified snapshot matches the live engine, so its weights could not come back. */
  | 'E_NOT_RESTORABLE'
  /** After a restore the engine's answer differs from the one recorded at capture. */
  | 'E_RESPONSE_MISMATCH'
  /** Too many requests are already waiting for that engine, or it cannot fit now; retry later. */
  | 'E_BUSY'
  /** No engine serves that model name. */
  | 'E_UNKNOWN_MODEL'
  /** A configuration file or an environment variable is invalid; `details.issues` lists each problem with its path (for a variable, its name) and line. */
  | 'E_CONFIG'
  /** Suspend refused (`onStale: 'refuse'`): the live weights differ from the snapshot; `details.regions` names the changed regions. */
  | 'E_STALE'
  /** Memory after a restore does not match the snapshot's GPU digests; `details.regions` says where. */
  | 'E_DIGEST_MISMATCH'
  /** A compressed chunk is damaged (its header, tables or codes do not add up); `details` names the chunk and the reason. Nothing of it was written, except with `details.written` (found by the GPU decode as it wrote: the restore fails before the engine uses the region). */
  | 'E_CODEC_CORRUPT'
  /** Deep suspend needs the driver's process checkpoint API (r570+), and this driver (or machine) lacks it. */
  | 'E_CHECKPOINT_UNSUPPORTED'
  /** A process checkpoint call failed; `details.call`, `details.pid`, `details.cudaError` and `details.reason` (timeout, gone, permission, state, ...) say which and why. */
  | 'E_CHECKPOINT'
  /** A bug in vsnap: please report it with the message. */
  | 'E_INTERNAL'
  /** Two GPUs cannot copy to each other directly (no NVLink or PCIe peer-to-peer between them): the neighbour tier and multi-path hydrate need it. */
  | 'E_PEER_UNSUPPORTED'
  /** A registry transfer failed (unreachable, TLS, an HTTP error, not a vsnap artifact); `details` has the status and URL. */
  | 'E_REGISTRY'
  /** A registry refused the credentials (or needs some); log in (docker login) or pass credentials. */
  | 'E_REGISTRY_AUTH'
  /** A registry request stalled (no byte for `timeouts.stallMs`) or trickled (slower than `timeouts.minBytesPerSecond`); `details.url` names it, `details.reason` is `stall` or `deadline`. */
  | 'E_REGISTRY_TIMEOUT';

// Every code once: the compiler checks this record against ErrorCode, so no code is missed.
const CODES: Record<ErrorCode, true> = {
  E_INVALID_ARGUMENT: true,
  E_INVALID_NAME: true,
  E_NATIVE_LOAD: true,
  E_CUDA_UNAVAILABLE: true,
  E_CUDA: true,
  E_IO: true,
  E_NO_SPACE: true,
  E_CHECKSUM: true,
  E_BLOB_TRUNCATED: true,
  E_BLOB_MISSING: true,
  E_MANIFEST_INVALID: true,
  E_MANIFEST_MISMATCH: true,
  E_SNAPSHOT_NOT_FOUND: true,
  E_NOT_DURABLE: true,
  E_STORE_INVALID: true,
  E_STORE_UNSAFE: true,
  E_STORE_LOCKED: true,
  E_ABORTED: true,
  E_TIMEOUT: true,
  E_CLOSED: true,
  E_OUT_OF_RANGE: true,
  E_IPC_PROTOCOL: true,
  E_IPC_AUTH: true,
  E_ADDRESS_IN_USE: true,
  E_ENGINE_HTTP: true,
  E_ENGINE_UNREACHABLE: true,
  E_ENGINE_PROTOCOL: true,
  E_ENGINE_STATE: true,
  E_NOT_RESTORABLE: true,
  E_RESPONSE_MISMATCH: true,
  E_BUSY: true,
  E_UNKNOWN_MODEL: true,
  E_CONFIG: true,
  E_STALE: true,
  E_DIGEST_MISMATCH: true,
  E_CODEC_CORRUPT: true,
  E_CHECKPOINT_UNSUPPORTED: true,
  E_CHECKPOINT: true,
  E_INTERNAL: true,
  E_PEER_UNSUPPORTED: true,
  E_REGISTRY: true,
  E_REGISTRY_AUTH: true,
  E_REGISTRY_TIMEOUT: true,
};
const KNOWN_CODES: ReadonlySet<string> = new Set(Object.keys(CODES));
/** EFBIG on Linux (the native addon reports errno numbers). */
const EFBIG = 27;

/**
 * A brand shared by every copy of this module in a process (the ESM and the CJS build are two
 * copies): `instanceof VsnapError` tests the brand, not the class object, so an error thrown by
 * one build is a VsnapError to the other.
 */
const BRAND: unique symbol = Symbol.for('vsnap.VsnapError') as never;

/**
 * The one error class of vsnap. `instanceof VsnapError` holds for errors from either build
 * (ESM or CommonJS) of vsnap loaded in the same process.
 * @public
 */
export class VsnapError extends Error {
  /** True for every VsnapError made by any copy of vsnap (the ESM and CommonJS builds alike). */
  static override [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === 'object' && value !== null && (value as { [BRAND]?: unknown })[BRAND] === true;
  }

  /** Stable code; see {@link ErrorCode}. */
  readonly code: ErrorCode;
  /** Structured facts about the failure (paths, regions, expected and actual values). */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(code: ErrorCode, message: string, details: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'VsnapError';
    Object.defineProperty(this, BRAND, { value: true });
    this.code = code;
    this.details = details;
  }
}

/**
 * Turns whatever the native addon (or Node) threw into a VsnapError, keeping code and details.
 * @internal
 */
export function toVsnapError(err: unknown): VsnapError {
  if (err instanceof VsnapError) return err;
  if (err instanceof Error) {
    const raw = (err as { code?: unknown }).code;
    const details = ((err as { details?: unknown }).details ?? {}) as Record<string, unknown>;
    if (raw === 'E_IO' && details.errno === EFBIG) {
      // a write past the process file-size limit (RLIMIT_FSIZE): out of room, as for a full disk
      return new VsnapError('E_NO_SPACE', `${err.message} (the process file-size limit, RLIMIT_FSIZE, was reached). Raise the limit or free space.`, details, { cause: err });
    }
    if (typeof raw === 'string' && KNOWN_CODES.has(raw)) {
      return new VsnapError(raw as ErrorCode, err.message, details, { cause: err });
    }
    if (typeof raw === 'string' && (raw === 'ENOSPC' || raw === 'EDQUOT' || raw === 'EFBIG')) {
      const limit = raw === 'EFBIG' ? ' (the process file-size limit, RLIMIT_FSIZE, was reached)' : '';
      return new VsnapError('E_NO_SPACE', `${err.message}${limit}. Free space or choose another store root.`, { errno: raw, path: (err as { path?: unknown }).path }, { cause: err });
    }
    if (typeof raw === 'string' && raw.startsWith('E')) {
      return new VsnapError('E_IO', err.message, { errno: raw, path: (err as { path?: unknown }).path }, { cause: err });
    }
    return new VsnapError('E_INTERNAL', err.message, {}, { cause: err });
  }
  return new VsnapError('E_INTERNAL', String(err));
}

/**
 * Throws E_INVALID_ARGUMENT naming the parameter, what was expected and what came.
 * @internal
 */
export function invalidArgument(name: string, expected: string, actual: unknown): never {
  let shown: string;
  try {
    shown = typeof actual === 'bigint' ? `${actual}n` : JSON.stringify(actual) ?? String(actual);
  } catch {
    shown = String(actual);
  }
  throw new VsnapError('E_INVALID_ARGUMENT', `${name} must be ${expected}, got ${shown}`, { name, expected });
}

/**
 * The E_ABORTED error for a signal, carrying its reason.
 * @internal
 */
export function abortError(signal: AbortSignal | undefined, what: string): VsnapError {
  return new VsnapError('E_ABORTED', `${what} was cancelled`, {}, { cause: signal?.reason });
}
