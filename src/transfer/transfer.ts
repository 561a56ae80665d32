import { abortError, toVsnapError } from '../errors.js';
import { native, type NativeHostBuffer, type NativeStagingPool, type NativeTransferRegion, type NativeTransferResult } from '../native/index.js';
import { isImported, memoryDevice, toNativeMemory, type RegionMemory } from '../regions/memory.js';
import { deviceContexts } from './contexts.js';
import { DEFAULT_CHUNK_SIZE, defaultThreads, stagingPools } from './staging.js';

/**
 * Progress of a long operation, reported about every 100 ms.
 * @public
 */
export interface TransferProgress {
  /**
   * `verifying` (checking blobs before a restore writes), `copying`, or `done`; a restore from the
   * RAM tier copies in a few stages, each reported as `starting` when it is queued, then `copying`
   * as its bytes land, and `done` once the last one did.
   */
  readonly phase: string;
  /** Bytes processed in this phase so far. */
  readonly bytesDone: number;
  /** Bytes the phase will process. */
  readonly bytesTotal: number;
}

/**
 * Options shared by every operation that moves bytes.
 * @public
 */
export interface TransferOptions {
  /** Called about every 100 ms with progress. */
  onProgress?: (progress: TransferProgress) => void;
  /** Cancels the operation between chunks (rejects with E_ABORTED). */
  signal?: AbortSignal;
  /** Worker threads of disk reads and writes (default: one per core, at most 16); a copy from the RAM tier takes one stream per GPU instead. */
  threads?: number;
  /**
   * Read blobs with O_DIRECT (cold data, skipping the page cache; buffered where the file system
   * refuses it). Coded blobs restored onto a GPU are read so too (4 KiB-aligned spans); coded blobs
   * decoded on the CPU, and the first bytes of each coded chunk that its header check reads, go
   * through the page cache.
   */
  directIo?: boolean;
}

/**
 * The `onProgress`, `signal` and `threads` of `options` that are set, to pass on to another
 * operation (`directIo` is left to the caller: it means nothing to a capture).
 * @internal
 */
export function passOn(options: TransferOptions): Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'> {
  return {
    ...(options.onProgress ? { onProgress: options.onProgress } : {}),
    ...(options.signal ? { signal: options.signal } : {}),
    ...(options.threads ? { threads: options.threads } : {}),
  };
}

/** A slice of RAM-tier memory. @internal */
export interface BufferMemory {
  readonly kind: 'buffer';
  readonly buffer: NativeHostBuffer;
  readonly offset: number;
}

/** @internal */
export interface TransferRegion {
  name: string;
  /** hydrate, verify; capture: optional with a hostCopy */
  blobPath?: string;
  size: number;
  chunkSize: number;
  checksums?: readonly string[];
  memory?: RegionMemory | BufferMemory;
  /** The region's bytes in the RAM tier: copy reads them from there; capture lands them there. */
  hostCopy?: BufferMemory;
}

/** @internal */
export interface TransferRequest extends TransferOptions {
  op: 'capture' | 'hydrate' | 'verify' | 'copy';
  label: string;
  regions: readonly TransferRegion[];
  verifyFirst?: boolean;
  /** capture: false lands the bytes in each region's hostCopy without hashing them (hash deferred). */
  hash?: boolean;
  /** capture: true also takes each chunk's GPU digest (vsnap-gd1) from the read that hashes it. */
  digest?: boolean;
}

/**
 * Whether any chunk moves through staging. Not when every region's bytes are RAM-tier memory on
 * one side (a copy from the RAM tier, a capture into or out of it, a load into it): then no pool
 * is leased, so nothing is allocated or pinned for it. Mirrors the native job's own rule.
 */
function needsStaging(request: TransferRequest): boolean {
  switch (request.op) {
    case 'copy':
      return false;
    case 'verify':
      return true;
    case 'capture':
      return request.regions.some((r) => r.memory?.kind !== 'buffer' && r.hostCopy === undefined);
    case 'hydrate':
      return request.verifyFirst === true || request.regions.some((r) => r.memory?.kind !== 'buffer');
  }
}

/** The GPUs of `regions`' memory (undefined for host memory and RAM-tier buffers). @internal */
export function regionDevices(regions: readonly TransferRegion[]): Array<number | undefined> {
  return regions.map((r) => (r.memory && r.memory.kind !== 'buffer' ? memoryDevice(r.memory) : undefined));
}

/**
 * Runs one job of the native transfer engine with a shared staging pool (pinned when any region
 * is on a GPU), progress, and cancellation.
 * @internal
 */
export async function runTransfer(request: TransferRequest): Promise<NativeTransferResult> {
  const { signal } = request;
  if (signal?.aborted) throw abortError(signal, `${request.op} of '${request.label}'`);
  const slotSize = Math.max(DEFAULT_CHUNK_SIZE, ...request.regions.map((r) => r.chunkSize));
  const devices = regionDevices(request.regions).filter((d) => d !== undefined);
  const needsPinning = devices.length > 0 || request.regions.some((r) => r.memory !== undefined && r.memory.kind !== 'buffer' && isImported(r.memory));
  const pinDevice = needsPinning ? (devices[0] ?? 0) : -1;
  const threads = request.threads ?? defaultThreads(new Set(devices).size);
  const regions: NativeTransferRegion[] = request.regions.map((r) => ({
    name: r.name,
    ...(r.blobPath !== undefined ? { blobPath: r.blobPath } : {}),
    size: r.size,
    chunkSize: r.chunkSize,
    ...(r.checksums ? { checksums: r.checksums } : {}),
    ...(r.memory ? { memory: r.memory.kind === 'buffer' ? r.memory : toNativeMemory(r.memory) } : {}),
    ...(r.hostCopy ? { hostCopy: r.hostCopy } : {}),
  }));
  // Every GPU's context is kept across operations (contexts.ts): one that came and went with
  // each transfer cost more than the copy itself on the GPUs the RAM tier is not pinned with.
  const withPool = <T>(use: (pool: NativeStagingPool | undefined) => Promise<T>): Promise<T> =>
    deviceContexts.use(devices, () => (needsStaging(request) ? stagingPools.lease(slotSize, pinDevice, threads, use) : use(undefined)));
  return withPool(async (pool) => {
    const onProgress = request.onProgress;
    let handle;
    try {
      handle = native().startTransfer(
        {
          op: request.op,
          label: request.label,
          ...(pool ? { pool } : {}),
          threads,
          directIo: request.directIo ?? false,
          verifyFirst: request.verifyFirst ?? false,
          ...(request.hash === false ? { hash: false } : {}),
          ...(request.digest ? { digest: true } : {}),
          regions,
        },
        onProgress ? (done, total, phase) => onProgress({ phase, bytesDone: done, bytesTotal: total }) : undefined,
      );
    } catch (err) {
      throw toVsnapError(err);
    }
    const cancel = (): void => handle.cancel();
    signal?.addEventListener('abort', cancel, { once: true });
    try {
      return await handle.promise;
    } catch (err) {
      const e = toVsnapError(err);
      if (e.code === 'E_ABORTED' && signal?.aborted) throw abortError(signal, `${request.op} of '${request.label}'`);
      throw e;
    } finally {
      signal?.removeEventListener('abort', cancel);
    }
  });
}
