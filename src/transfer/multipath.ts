import { abortError, invalidArgument, toVsnapError } from '../errors.js';
import { native, type NativeHostBuffer, type NativeMultipathResult, type NativeMultipathSpec } from '../native/index.js';
import { toNativeMemory, type RegionMemory } from '../regions/memory.js';
import { stagingIdleMs } from '../settings.js';
import type { TransferProgress } from './transfer.js';

// Multi-path hydrate (docs/multipath.md): a RAM-tier restore onto one GPU that streams part of
// the bytes through a neighbour GPU (host -> ring in its free memory -> peer copy -> target)
// while the rest goes host -> target directly. The scheduling lives in the native job
// (native/transfer/multipath.h); this module checks the request and runs it.

/**
 * A restore from the RAM tier onto one GPU over two PCIe links: the target's own, and a
 * neighbour GPU's, whose free memory holds a small ring of staging slots that are peer-copied
 * (NVLink) into the target. Chunks are taken from one queue by both paths as each has room, so
 * the split follows the links' actual rates (a busy neighbour takes fewer).
 * @public
 */
export interface MultipathOptions {
  /** The neighbour GPU (its ordinal in this process); it must differ from the target's and reach it by peer copy. */
  readonly neighbour: number;
  /** Ring slots on the neighbour (default 4); each is one chunk. */
  readonly ringSlots?: number;
  /** Chunk size in bytes (default 64 MiB, a multiple of 4096). */
  readonly chunkSize?: number;
  /** Copies in flight on the direct path (default 4). */
  readonly directSlots?: number;
  /** Streams on the target that the direct path's copies round-robin over (default 2). */
  readonly directStreams?: number;
  /**
   * Aborting it releases the neighbour mid-restore (its memory is needed): the neighbour path
   * stops taking chunks, waits for those in flight, frees its ring, and the direct path finishes
   * the rest. The restore itself goes on.
   */
  readonly releaseNeighbour?: AbortSignal;
  /**
   * Fail (E_PEER_UNSUPPORTED, E_CUDA) instead of restoring over the direct path alone when the
   * neighbour cannot be used (no peer access, no free memory for the ring). Default false.
   */
  readonly requireNeighbour?: boolean;
  /** Test hook for the host backend (faults at chunk N of a path, delays). @internal */
  readonly testFaults?: NativeMultipathSpec['faults'];
}

/**
 * How a multi-path restore split its bytes.
 * @public
 */
export interface MultipathStats {
  /** Bytes that went from host memory to the target directly. */
  readonly bytesDirect: number;
  /** Bytes that went through the neighbour. */
  readonly bytesNeighbour: number;
  /** Chunks the neighbour path handed back to the direct path (released or failed mid-restore). */
  readonly requeuedChunks: number;
  /** Whether the neighbour path ran at all. */
  readonly neighbourUsed: boolean;
  /** Whether `releaseNeighbour` stopped it. */
  readonly neighbourReleased: boolean;
  /** Why the neighbour path stopped early or was not used. */
  readonly neighbourNote?: string;
  /** Where the time went: setup, each path's busy time, teardown. */
  readonly timeline: MultipathTimeline;
}

/**
 * When one path of a multi-path restore was busy, in seconds since the copies began.
 * @public
 */
export interface MultipathPathTimeline {
  /** Its first copy was issued (-1: it took no chunk). */
  readonly firstStart: number;
  /** Its last copy was seen complete (-1: none). */
  readonly lastEnd: number;
  /** Time at least one of its copies was in flight. */
  readonly busySeconds: number;
  /** The most copies it had in flight at once. */
  readonly maxInFlight: number;
}

/**
 * Where a multi-path restore's time went.
 * @public
 */
export interface MultipathTimeline {
  /** Before the first copy: streams, the neighbour's context, peer access and ring. */
  readonly setupSeconds: number;
  /** From the first copy to the last. */
  readonly copySeconds: number;
  /** After the last copy: streams drained, the ring freed. */
  readonly teardownSeconds: number;
  /** The direct path: host to the target GPU over its own link. */
  readonly direct: MultipathPathTimeline;
  /** The neighbour path: host to the neighbour's ring, peer-copied into the target. */
  readonly neighbour: MultipathPathTimeline;
}

/** @internal */
export interface MultipathRequest extends MultipathOptions {
  readonly label: string;
  readonly regions: ReadonlyArray<{ name: string; size: number; memory: RegionMemory; source: { buffer: NativeHostBuffer; offset: number } }>;
  readonly signal?: AbortSignal;
  readonly onProgress?: (progress: TransferProgress) => void;
}

const DEFAULT_CHUNK = 64 * 1024 * 1024;

/** Checks the options (E_INVALID_ARGUMENT) and picks the backend from the regions' memory. @internal */
export function multipathSpec(request: MultipathRequest): NativeMultipathSpec {
  const { neighbour } = request;
  if (!Number.isInteger(neighbour) || neighbour < 0) invalidArgument('multipath.neighbour', 'a GPU ordinal (integer >= 0)', neighbour);
  const chunkSize = request.chunkSize ?? DEFAULT_CHUNK;
  if (!Number.isSafeInteger(chunkSize) || chunkSize <= 0 || chunkSize % 4096 !== 0) invalidArgument('multipath.chunkSize', 'a positive multiple of 4096', chunkSize);
  const slots = (name: string, v: number | undefined, d: number, min: number): number => {
    const n = v ?? d;
    if (!Number.isInteger(n) || n < min || n > 64) invalidArgument(`multipath.${name}`, `an integer ${min}..64`, v);
    return n;
  };
  // A region set's mapping counts as the memory it was opened from.
  const kinds = new Set(request.regions.map((r) => (r.memory.kind === 'mapped' ? (r.memory.source === 'host' ? 'host' : 'imported') : r.memory.kind)));
  if (kinds.size > 1 && kinds.has('host')) invalidArgument('regions', 'all host memory or all GPU memory for a multi-path restore', [...kinds]);
  const backend = kinds.has('host') ? 'host' : 'cuda';
  for (const r of request.regions) {
    if (backend === 'cuda' && r.memory.kind === 'device' && r.memory.allocation.device === neighbour) {
      invalidArgument('multipath.neighbour', `a GPU other than the target's (${neighbour})`, neighbour);
    }
  }
  return {
    label: request.label,
    backend,
    chunkSize,
    directSlots: slots('directSlots', request.directSlots, 4, 1),
    directStreams: slots('directStreams', request.directStreams, 2, 1),
    relaySlots: slots('ringSlots', request.ringSlots, 4, 1),
    ...(backend === 'cuda' ? { neighbour } : {}),
    requireRelay: request.requireNeighbour ?? false,
    relayReleased: request.releaseNeighbour?.aborted ?? false,
    ...(request.testFaults ? { faults: request.testFaults } : {}),
    regions: request.regions.map((r) => ({
      name: r.name,
      size: r.size,
      memory: toNativeMemory(r.memory),
      source: { kind: 'buffer' as const, buffer: r.source.buffer, offset: r.source.offset },
    })),
  };
}

/** The native result as the public stats. @internal */
export function multipathStats(r: NativeMultipathResult): MultipathStats {
  return {
    bytesDirect: r.bytesDirect,
    bytesNeighbour: r.bytesRelay,
    requeuedChunks: r.requeued,
    neighbourUsed: r.relayUsed,
    neighbourReleased: r.relayCancelled,
    ...(r.relayError ? { neighbourNote: r.relayError } : {}),
    timeline: {
      setupSeconds: r.setupSeconds,
      copySeconds: Math.max(0, r.seconds - r.setupSeconds - r.teardownSeconds),
      teardownSeconds: r.teardownSeconds,
      direct: { ...r.direct },
      neighbour: { ...r.relay },
    },
  };
}

let warmUsers = 0;
let warmHeld = false; // a GPU multi-path restore ran: the addon may hold a neighbour context
let warmTimer: NodeJS.Timeout | undefined;

/**
 * Frees the neighbour GPU contexts that multi-path restores keep between jobs (so that a restore
 * does not create one, and map the pinned RAM tier into it, inside its own time). @internal
 */
export function releaseWarmNeighbours(): void {
  if (warmTimer) clearTimeout(warmTimer);
  warmTimer = undefined;
  if (warmUsers > 0 || !warmHeld) return; // a running restore's timer is set again after it
  warmHeld = false;
  try {
    native().releaseWarmNeighbours();
  } catch {
    // no binding loaded: nothing is held
  }
}

/**
 * Runs one multi-path restore: the whole job cancels with `signal` (E_ABORTED), the neighbour
 * path alone with `releaseNeighbour`. Resolves only when every byte was confirmed written.
 * @internal
 */
export async function runMultipath(request: MultipathRequest): Promise<NativeMultipathResult> {
  const spec = multipathSpec(request);
  const warmIdleMs = stagingIdleMs(); // neighbour contexts kept between restores are freed after this long without one
  const { signal, releaseNeighbour, onProgress } = request;
  if (signal?.aborted) throw abortError(signal, `multi-path restore of '${request.label}'`);
  let handle;
  try {
    handle = native().startMultipath(spec, onProgress ? (done, total) => onProgress({ phase: 'copying', bytesDone: done, bytesTotal: total }) : undefined);
  } catch (err) {
    throw toVsnapError(err);
  }
  warmUsers++;
  if (warmTimer) clearTimeout(warmTimer);
  warmTimer = undefined;
  const cancel = (): void => handle.cancel();
  const release = (): void => handle.cancelRelay();
  signal?.addEventListener('abort', cancel, { once: true });
  if (releaseNeighbour?.aborted) release();
  else releaseNeighbour?.addEventListener('abort', release, { once: true });
  try {
    return await handle.promise;
  } catch (err) {
    const e = toVsnapError(err);
    if (e.code === 'E_ABORTED' && signal?.aborted) throw abortError(signal, `multi-path restore of '${request.label}'`);
    throw e;
  } finally {
    signal?.removeEventListener('abort', cancel);
    releaseNeighbour?.removeEventListener('abort', release);
    if (spec.backend === 'cuda') warmHeld = true;
    if (--warmUsers === 0 && warmHeld) {
      warmTimer = setTimeout(releaseWarmNeighbours, warmIdleMs);
      warmTimer.unref();
    }
  }
}

/** Whether two GPUs can copy to each other directly (cuDeviceCanAccessPeer). @internal */
export function canAccessPeer(device: number, peer: number): boolean {
  try {
    return native().canAccessPeer(device, peer);
  } catch (err) {
    throw toVsnapError(err);
  }
}

