import type { LiveLayout } from '../manifest/compat.js';
import type { RegistryConnectOptions } from './http.js';

/**
 * Progress of a push or pull: `hashing`, `uploading`, `downloading`, `verifying`, `done`.
 * @public
 */
export interface RegistryProgress {
  /** What is happening now. */
  readonly phase: string;
  /** Bytes of the phase done so far. */
  readonly bytesDone: number;
  /** Bytes the phase moves. */
  readonly bytesTotal: number;
}

/**
 * Options of a {@link RegistryClient}.
 * @public
 */
export interface RegistryOptions extends RegistryConnectOptions {
  /** Where pushes keep blob hashes and unfinished uploads. Default `$XDG_CACHE_HOME/vsnap/registry`. */
  readonly stateDir?: string;
  /** Bytes per PATCH of an upload. Default 64 MiB (registries on object storage need 5 MiB or more). */
  readonly chunkBytes?: number;
  /** Blobs this large or larger are downloaded over several connections with Range requests. Default 256 MiB. */
  readonly rangeMinBytes?: number;
  /**
   * Bytes of chunk buffers a pull holds at once: each part being downloaded holds one chunk of
   * its region (the chunk is checked whole before it is written). Default 256 MiB (four 64 MiB
   * chunks); a snapshot whose chunks are larger downloads one part at a time.
   */
  readonly maxBufferedBytes?: number;
}

/**
 * Options of {@link RegistryClient.push}.
 * @public
 */
export interface PushOptions {
  /** A capture other than the current one. */
  readonly id?: string;
  /** Ask the registry to mount blobs it has in this other repository instead of uploading them. */
  readonly mountFrom?: string;
  /** Cancels the push (E_ABORTED); the uploads done so far are resumed by the next push. */
  readonly signal?: AbortSignal;
  /** Called as bytes are hashed and sent. */
  readonly onProgress?: (p: RegistryProgress) => void;
}

/**
 * What {@link RegistryClient.push} did.
 * @public
 */
export interface PushReport {
  /** The reference pushed. */
  readonly reference: string;
  /** The OCI manifest's digest (pull `<repo>@<digest>` for exactly this capture). */
  readonly digest: string;
  /** Layers in the manifest (distinct region blobs). */
  readonly layers: number;
  /** Bytes sent in blob uploads by this push. */
  readonly bytesUploaded: number;
  /** Bytes the registry already had (not sent). */
  readonly bytesSkipped: number;
  /** Bytes of interrupted uploads that this push resumed after (not sent again). */
  readonly bytesResumed: number;
  /** Wall time. */
  readonly seconds: number;
}

/**
 * Facts a pulled snapshot must match, checked from the config BEFORE any layer is fetched:
 * a {@link LiveLayout}, whose `ranks` may be left out to compare only the engine, model and
 * platform facts.
 * @public
 */
export type PullCompatibility = Omit<LiveLayout, 'ranks'> & { readonly ranks?: LiveLayout['ranks'] };

/**
 * Options of {@link RegistryClient.pull}.
 * @public
 */
export interface PullOptions {
  /** The name to store it under. Default: the name it was pushed with. */
  readonly name?: string;
  /** Refuse (E_MANIFEST_MISMATCH, every difference listed) before downloading when the snapshot does not fit. */
  readonly live?: PullCompatibility;
  /** Cancels the pull (E_ABORTED); nothing of it is left in the store. */
  readonly signal?: AbortSignal;
  /** Called as bytes arrive. */
  readonly onProgress?: (p: RegistryProgress) => void;
}

/**
 * What {@link RegistryClient.pull} did.
 * @public
 */
export interface PullReport {
  /** The snapshot name in the store. */
  readonly name: string;
  /** The capture id (kept from the pushed capture). */
  readonly id: string;
  /** The OCI manifest's digest. */
  readonly digest: string;
  /** Bytes of region data in the snapshot. */
  readonly bytes: number;
  /** Bytes downloaded (blobs the store lacked). */
  readonly bytesDownloaded: number;
  /** Bytes the store already had (not downloaded). */
  readonly bytesSkipped: number;
  /** Wall time. */
  readonly seconds: number;
}
