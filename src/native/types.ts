/**
 * The raw binding's shape, as native/addon.cc exports it. Only src/native loads it; the rest of
 * the SDK calls it through {@link native}.
 * @internal
 */

export interface NativeCudaStatus {
  available: boolean;
  reason: string;
  driverVersion: number;
  library: string;
  checkpointApi: boolean;
}

export interface NativeDeviceInfo {
  ordinal: number;
  name: string;
  uuid: string;
  pciBusId: string;
  computeCapability: string;
  totalMemory: number;
  freeMemory: number | null;
  vmmGranularity: number;
  vmmSupported: boolean;
  posixFdHandlesSupported: boolean;
}

export interface NativeDeviceAllocation {
  readonly address: bigint;
  readonly size: number;
  readonly device: number;
  readonly closed: boolean;
  exportFd(): number;
  write(offset: number, data: Uint8Array): Promise<void>;
  read(offset: number, length: number): Promise<Buffer>;
  fill(offset: number, length: number, value: number): Promise<void>;
  close(): void;
}

export interface NativeStagingPool {
  readonly slotSize: number;
  readonly slotCount: number;
  readonly pinned: boolean;
  /** Slots not lent to a transfer now. */
  readonly freeSlots: number;
  readonly closed: boolean;
  close(): void;
}

export interface NativeHostBuffer {
  readonly size: number;
  readonly pinned: boolean;
  readonly closed: boolean;
  read(offset: number, length: number): Buffer;
  close(): void;
}

export interface NativeHeldHandles {
  readonly count: number;
  readonly closed: boolean;
  close(): void;
}

/** Regions opened once (mmapped / imported and mapped) for several operations (native/js/js_region_set.cc). */
export interface NativeRegionSet {
  readonly count: number;
  readonly closed: boolean;
  /** Whether the regions were mapped in the batched form (one reservation and access call per device). */
  readonly batched: boolean;
  /** Whether the set was returned before its regions were mapped (they are mapped in the background, in order). */
  readonly pipelined: boolean;
  /** Resolves once every region is mapped; rejects with the error that stopped the mapping. */
  settled(): Promise<void>;
  /** Drops this handle and unmaps off the JS thread (a running transfer keeps what it uses until it ends). */
  release(): Promise<void>;
  /** Drops this handle now (unmapping on the JS thread if nothing else uses the regions). */
  close(): void;
}

/** How a region set maps its regions (native/transfer/region_set.h MapMode). */
export type NativeMapping = 'auto' | 'batched' | 'per-region' | 'pipelined';
/** The batched open's fault points (native/common/fault.h). */
export type NativeMapFault = 'map-import' | 'map-reserve' | 'map-map' | 'map-access';
/** The steps vmmTimings() reports: calls made, regions they covered, summed seconds. */
export type NativeVmmStep = 'import' | 'props' | 'setup' | 'reserve' | 'map' | 'access' | 'unmap' | 'addressFree' | 'release' | 'closeFd';
export type NativeVmmTimings = Record<NativeVmmStep, { calls: number; items: number; seconds: number }>;

export type NativeMemorySpec =
  | { kind: 'host'; fd: number }
  | { kind: 'imported'; fd: number }
  | { kind: 'device'; allocation: NativeDeviceAllocation }
  | { kind: 'buffer'; buffer: NativeHostBuffer; offset: number }
  | { kind: 'mapped'; set: NativeRegionSet; index: number };

export interface NativeTransferRegion {
  name: string;
  /** hydrate, verify; capture: optional with a hostCopy */
  blobPath?: string;
  size: number;
  chunkSize: number;
  checksums?: readonly string[];
  memory?: NativeMemorySpec;
  /** The region's bytes in a HostBuffer slice: copy reads the verified bytes; capture fills it. */
  hostCopy?: NativeMemorySpec;
}

export interface NativeTransferSpec {
  op: 'capture' | 'hydrate' | 'verify' | 'copy';
  label: string;
  /** required except for copy */
  pool?: NativeStagingPool;
  threads?: number;
  directIo?: boolean;
  verifyFirst?: boolean;
  /** capture: false lands every region in its hostCopy without hashing (no blobPath; checksums come back empty). Default true. */
  hash?: boolean;
  /** capture (hashed): also each chunk's GPU digest (vsnap-gd1), from the same read as its checksum. */
  digest?: boolean;
  regions: NativeTransferRegion[];
}

export interface NativeTransferResult {
  bytes: number;
  seconds: number;
  /** capture only: per region, its chunk checksums */
  checksums?: string[][];
  /** capture with `digest`: per region, its chunks' GPU digests */
  digests?: string[][];
  /** Per GPU the regions are on: bytes, and seconds from the start of the copy pass until its last byte landed. Absent from an older addon. */
  devices?: Array<{ device: number; bytes: number; seconds: number }>;
}

/** One region of a copy queue's batch (native/js/js_copy_queue.cc): RAM-tier bytes into `memory`. */
export interface NativeCopyItem {
  name: string;
  size: number;
  memory: NativeMemorySpec;
  source: { kind: 'buffer'; buffer: NativeHostBuffer; offset: number };
}

/** A batch of a copy queue, landed: seconds since the queue opened. */
export interface NativeCopyBatch {
  id: number;
  bytes: number;
  /** Its first copy issued (-1: none was, an empty batch). */
  issuedAt: number;
  /** Its last byte landed. */
  landedAt: number;
  /** Copies issued: regions mapped side by side in one region set share them (up to the chunk size each). */
  copies: number;
  /** Per GPU written to, the bytes. */
  devices: Array<{ device: number; bytes: number }>;
}

/**
 * Copies RAM-tier bytes into regions batch after batch, in the order pushed, on one stream per GPU
 * (native/transfer/copy_queue.h). An idle queue does not keep the event loop alive.
 */
export interface NativeCopyQueue {
  /** Settles once the batch's last byte landed; a failure rejects it and every later batch. */
  push(items: readonly NativeCopyItem[]): Promise<NativeCopyBatch>;
  /** No more batches: resolves once every batch settled and the queue's threads ended. */
  close(): Promise<void>;
  /** Stops at the next chunk; the batches left reject with E_ABORTED (each once what was issued for it landed). */
  cancel(): void;
  readonly bytesLanded: number;
}

export interface NativeTransferHandle {
  promise: Promise<NativeTransferResult>;
  cancel(): void;
}

export type NativeFdEvent =
  | { type: 'delivery'; nonce: string; header: string; fds: number[]; pid: number }
  | { type: 'reject'; reason: string; pid: number };

export interface NativeFdListener {
  readonly path: string;
  expect(nonce: string, offerHeader?: string, offerFds?: readonly number[]): void;
  forget(nonce: string): void;
  ref(): void;
  unref(): void;
  close(): void;
}

/** One region to digest (native/js/js_digest.cc). */
export interface NativeDigestRegion {
  size: number;
  chunkSize: number;
  memory: NativeMemorySpec;
}

export interface NativeDigestResult {
  /** Per region, one vsnap-gd1 digest (32 hex digits) per chunk. */
  digests: string[][];
  /** Per region: `gpu` (device/imported memory, the kernel) or `cpu` (host memory). */
  backends: Array<'gpu' | 'cpu'>;
  /** Kernel time in ms of each device's batch, at the index of its first region (0 elsewhere). */
  kernelMs: number[];
  seconds: number;
  /** Per GPU (each digests its batch concurrently): bytes, wall time of its batch, kernel ms. Absent from an older addon. */
  devices?: Array<{ device: number; bytes: number; seconds: number; kernelMs: number }>;
}

/** A multi-path restore (native/js/js_multipath.cc). */
export interface NativeMultipathSpec {
  label: string;
  /** `cuda`: targets on one GPU, a ring on the neighbour; `host`: the same scheduler in host memory (tests, CPU backend). */
  backend: 'cuda' | 'host';
  chunkSize: number;
  directSlots?: number;
  /** cuda: streams the direct path's slots round-robin over (default 2). */
  directStreams?: number;
  relaySlots?: number;
  /** cuda: the neighbour GPU; absent: the direct path only. */
  neighbour?: number;
  /** cuda: throw instead of running on the direct path alone when the neighbour cannot be used. */
  requireRelay?: boolean;
  /** The neighbour path is released before the job starts (it takes no chunk). */
  relayReleased?: boolean;
  /**
   * host backend only: copy number N (1-based) of a path fails at its wait; each copy waits delay
   * ms. A fixed schedule (native/transfer/multipath.h, MultipathTestSchedule): `relayChunks` N,
   * the neighbour path takes the last N chunks and no others, the direct path none before it has
   * them; `holdRelay`, a neighbour copy completes only once the direct path has taken every other
   * chunk (or the neighbour is released, or the job stops).
   */
  faults?: { failRelayAt?: number; failDirectAt?: number; relayDelayMs?: number; directDelayMs?: number; relayChunks?: number; holdRelay?: boolean };
  regions: Array<{ name: string; size: number; memory: NativeMemorySpec; source: { kind: 'buffer'; buffer: NativeHostBuffer; offset: number } }>;
}

/** When one path of a multi-path job was busy, in seconds since its copies began (-1: never). */
export interface NativeMultipathTimeline {
  firstStart: number;
  lastEnd: number;
  /** Time at least one of the path's copies was in flight. */
  busySeconds: number;
  maxInFlight: number;
}

export interface NativeMultipathResult {
  bytes: number;
  seconds: number;
  /** Of seconds: building the backend (streams, the neighbour's context and ring) before the first copy. */
  setupSeconds: number;
  /** Of seconds: after the last copy, draining streams and freeing the ring. */
  teardownSeconds: number;
  direct: NativeMultipathTimeline;
  relay: NativeMultipathTimeline;
  bytesDirect: number;
  bytesRelay: number;
  chunksDirect: number;
  chunksRelay: number;
  /** Chunks the neighbour path gave back to the direct path (cancelled or failed). */
  requeued: number;
  maxRelayInFlight: number;
  relayUsed: boolean;
  relayCancelled: boolean;
  /** Why the neighbour path stopped early or was not used; empty otherwise. */
  relayError: string;
}

export interface NativeMultipathHandle {
  promise: Promise<NativeMultipathResult>;
  cancel(): void;
  /** Stops the neighbour path (its in-flight chunks drain, its ring is freed); the direct path finishes. */
  cancelRelay(): void;
  /** Neighbour memory the ring holds now. */
  ringBytes(): number;
}

export interface NativePeerCopySpec {
  /** The GPU whose stream runs the copies (granted access to both sides). */
  device: number;
  pairs: Array<{ src: NativeMemorySpec; dst: NativeMemorySpec; size: number }>;
  repeats?: number;
}

export interface NativeBinding {
  abiVersion: number;
  cudaStatus(): Promise<NativeCudaStatus>;
  cudaDevices(withFreeMemory: boolean): Promise<NativeDeviceInfo[]>;
  cudaHoldsContext(device: number): boolean;
  /** Keeps the device's primary context retained until cudaReleaseContext (src/transfer/contexts.ts). */
  cudaKeepContext(device: number): Promise<void>;
  cudaReleaseContext(device: number): Promise<void>;
  allocateDevice(device: number, size: number): Promise<NativeDeviceAllocation>;
  /** One allocation a size, mapped side by side in one reservation with one access call; the memory goes once all are closed. */
  allocateDeviceSet(device: number, sizes: readonly number[]): Promise<NativeDeviceAllocation[]>;
  createStagingPool(slotSize: number, slotCount: number, pinDevice: number): Promise<NativeStagingPool>;
  createHostBuffer(size: number, pinDevice: number): Promise<NativeHostBuffer>;
  /**
   * Reads byte ranges of files into a HostBuffer with pread (8 MiB pieces over `threads` threads):
   * per file its expected size (E_BLOB_TRUNCATED otherwise; E_BLOB_MISSING for one that is gone)
   * and `reads`, (fileOffset, length, at) per range, landing at `dest.offset + at`. `direct`:
   * O_DIRECT where the file system allows it (buffered where it refuses); every range's fileOffset
   * and buffer position then 4 KiB aligned, and the buffer has room for its length rounded up to
   * 4 KiB (the bytes past the range up to there are overwritten).
   */
  readFilesInto(
    dest: { kind: 'buffer'; buffer: NativeHostBuffer; offset: number },
    files: ReadonlyArray<{ path: string; size: number; reads: Float64Array }>,
    threads: number,
    direct?: boolean,
  ): Promise<{ bytes: number; seconds: number }>;
  holdHandles(fds: readonly number[]): Promise<NativeHeldHandles>;
  startTransfer(
    spec: NativeTransferSpec,
    onProgress?: (done: number, total: number, phase: string) => void,
  ): NativeTransferHandle;
  /** peerDeadlineMs: how long one connection may take from accept to reply (default 10 s). */
  FdListener: new (path: string, onEvent: (event: NativeFdEvent) => void, peerDeadlineMs?: number) => NativeFdListener;
  sendFds(path: string, nonce: string, header: string, fds: readonly number[], timeoutMs?: number): Promise<{ reply: string; fds: number[] }>;
  checksum(data: Uint8Array): string;
  /** Tests only: arms a fault point (native/common/fault.h) for its next `times` hits. */
  setFault(point: 'thread-start' | 'chunk-delay' | 'copy-fail' | 'codec-scratch' | 'codec-restore-scratch' | NativeMapFault, times: number, arg?: number): void;
  checksumAlgorithm: string;
  checksumImplementation: string;
  createMemfd(name: string, size: number): number;
  /**
   * Returns the locked descriptor, or -1 if another holder conflicts. `readOnly`: opens an
   * existing file read-only (creates nothing) and returns -2 when there is none.
   */
  tryLockFile(path: string, exclusive: boolean, readOnly?: boolean): number;
  fdSize(fd: number): number;
  digestRegions(regions: readonly NativeDigestRegion[]): Promise<NativeDigestResult>;
  digestBytes(data: Uint8Array, chunkSize: number): string[];
  digestBench(src: NativeDeviceAllocation, dst: NativeDeviceAllocation, size: number, chunkSize: number, repeats: number): Promise<{ digestMs: number[]; copyMs: number[] }>;
  digestAlgorithm: string;
  /** vsnap-c1 (native/codec): encodes a chunk on the CPU with a dtype hint (NativeCodecKind number, 0: none). */
  codecEncode(data: Uint8Array, kind: number): Buffer;
  /** Decodes a coded chunk on the CPU into rawSize bytes; E_CODEC_CORRUPT (details.reason) when damaged. */
  codecDecode(coded: Uint8Array, rawSize: number): Buffer;
  /** codecEncode off the JS thread (the libuv pool); `data` must not change until it settles. */
  codecEncodeAsync(data: Uint8Array, kind: number): Promise<Buffer>;
  /** codecDecode off the JS thread, the header checked first on the calling one; `coded` must not change until it settles. */
  codecDecodeAsync(coded: Uint8Array, rawSize: number): Promise<Buffer>;
  /** A coded chunk's header, checked (with its tables) as for a decode. */
  codecParse(coded: Uint8Array, rawSize: number): NativeCodecHeader;
  /** Tests: encodes on GPU `device` (host bytes in, coded bytes out through the device). */
  codecEncodeDevice(data: Uint8Array, kind: number, device: number): Promise<{ coded: Buffer; kernelMs: number }>;
  /** Tests: decodes on GPU `device` (the header checked on the host first). */
  codecDecodeDevice(coded: Uint8Array, rawSize: number, device: number): Promise<{ data: Buffer; kernelMs: number }>;
  /**
   * Restores chunks held in a HostBuffer (coded or raw) into device memory: coded chunks cross the
   * link into two device scratch slots and are decoded from there into the target while the next
   * crosses (native/codec/codec_restore.h). `chunks`: (at, held, rawSize, dstOffset, coded 0/1) per chunk.
   */
  codecRestoreHeld(
    source: { kind: 'buffer'; buffer: NativeHostBuffer; offset: number },
    targets: ReadonlyArray<{ memory: NativeMemorySpec; size: number; chunks: Float64Array }>,
  ): Promise<{ seconds: number; rawBytes: number; linkBytes: number; scratchBytes: number }>;
  /**
   * A capture into the RAM tier coded on the GPU (native/codec/codec_capture.h): each chunk of a
   * device source is encoded on its GPU into one of two device scratch slots while the previous
   * chunk's coded bytes (or raw bytes, where it did not shrink) cross into the HostBuffer, packed
   * 16-byte aligned from `dest.offset`, never past `limit`. `kind`: the dtype hint (the
   * format's kind number, 0: none). `chunks`: per source, (at, held, rawSize, coded 0/1) per chunk.
   */
  codecCaptureHeld(
    dest: { kind: 'buffer'; buffer: NativeHostBuffer; offset: number },
    limit: number,
    sources: ReadonlyArray<{ memory: NativeMemorySpec; size: number; chunkSize: number; kind: number }>,
  ): Promise<{ seconds: number; rawBytes: number; linkBytes: number; scratchBytes: number; end: number; chunks: Float64Array[] }>;
  /** Opens every region at once, on up to `threads` threads (default 4); nothing stays open on failure. */
  openRegions(regions: ReadonlyArray<{ kind: 'host' | 'imported'; fd: number; size: number; device?: number }>, threads?: number, mapping?: NativeMapping): Promise<NativeRegionSet>;
  /** Process-wide totals per VMM step of opening and closing region sets (native/cuda/vmm_timing.h). */
  vmmTimings(): NativeVmmTimings;
  /** How many region mappings this process made so far (tests: nothing mapped twice). */
  regionCounters(): { hostMaps: number; imports: number };
  /** The driver's state of a CUDA process (native/js/js_checkpoint.cc); E_CHECKPOINT_UNSUPPORTED without the API. */
  checkpointState(pid: number): Promise<NativeProcessState>;
  /** Locks a CUDA process (its CUDA calls then block); timeoutMs 0 waits without limit. */
  checkpointLock(pid: number, timeoutMs: number): Promise<void>;
  /** Moves a locked process's GPU memory to host RAM and releases its GPU resources. */
  checkpointCheckpoint(pid: number): Promise<void>;
  /**
   * Brings a checkpointed process back onto its GPUs; it stays locked. With `pairs`, onto other
   * GPUs of the same chip (driver r580+, else E_CHECKPOINT_UNSUPPORTED): every GPU it was
   * checkpointed with must be listed.
   */
  checkpointRestore(pid: number, pairs?: readonly NativeGpuPair[]): Promise<void>;
  /** Lets a locked process make CUDA calls again. */
  checkpointUnlock(pid: number): Promise<void>;
  /** cuDeviceCanAccessPeer (native/js/js_peer.cc). */
  canAccessPeer(device: number, peer: number): boolean;
  /** Device-to-device copies between GPUs, on one stream of `device`; per repeat, its wall time. */
  peerCopy(spec: NativePeerCopySpec): Promise<{ bytes: number; seconds: number; copySeconds: number[] }>;
  /** chunkSize: the largest single copy (default 64 MiB); onProgress: bytes landed, about every 256 MiB. */
  CopyQueue: new (label: string, chunkSize?: number, onProgress?: (landed: number) => void) => NativeCopyQueue;
  startMultipath(spec: NativeMultipathSpec, onProgress?: (done: number, total: number) => void): NativeMultipathHandle;
  /** Frees the neighbour contexts multi-path restores keep between jobs. */
  releaseWarmNeighbours(): void;
}

/** One GPU of a remapping process restore (CUcheckpointGpuPair), by UUID ("GPU-…"). */
export interface NativeGpuPair {
  oldUuid: string;
  newUuid: string;
}

/** A vsnap-c1 chunk header (native/codec/codec.h Header): mode 0 raw, 1 planes; kind 1..6 (bytes, bf16, fp16, fp32, e4m3, e5m2). */
export interface NativeCodecHeader {
  mode: number;
  kind: number;
  width: number;
  rawSize: number;
  codedSize: number;
  blockCount: number;
  exceptionCount: number;
}

/** CUprocessState as the addon names it. */
export type NativeProcessState = 'running' | 'locked' | 'checkpointed' | 'failed' | 'unknown';
