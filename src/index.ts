/**
 * vsnap: suspend and restore LLM inference engines on a GPU in well under a second.
 *
 * The root holds what users hold: a {@link RegionStore} of {@link Snapshot}s (each described by a
 * {@link Manifest}), an {@link EngineClient} per engine, an {@link EngineSession} holding an engine
 * with its store and tiers, the engine flows ({@link captureEngine},
 * {@link (suspendEngine:1)}, {@link restoreEngine}, {@link swapEngines}), the places weights are
 * kept while an engine sleeps ({@link RamTier}, {@link GpuTier}, {@link NeighbourTier};
 * see {@link EngineTiers}), the {@link RegistryClient} and the {@link SwapController}. The `vsnap serve`
 * application is `vsnap/serve`; memory regions, descriptors and devices for embedders are
 * `vsnap/plumbing`.
 *
 * @packageDocumentation
 */

export { VERSION } from './version.js';
export { VsnapError, type ErrorCode } from './errors.js';
export { cudaStatus, type CudaStatus, type GpuDevice } from './gpu/cuda.js';

export { Manifest, type ManifestIssue } from './manifest/manifest.js';
export type { LiveLayout, LiveRegion, Mismatch } from './manifest/compat.js';
export type { EngineInfo, ExpectedResponse, ManifestData, ModelInfo, PlatformInfo, RankInfo, RegionCodec, RegionInfo, TensorInfo } from './manifest/types.js';

export { RegionStore, type RegionStoreOptions, type SnapshotList, type SnapshotSummary, type StoreProblem, type VerifyProblem, type VerifyReport } from './store/region-store.js';

export { Snapshot } from './snapshot/snapshot.js';
export type { CaptureHash, CaptureOptions, CaptureRegion, DeviceTiming, PersistPolicy, RestoreOptions, RestoreRegion, TransferSummary } from './snapshot/snapshot-types.js';
export type { StoreCodec } from './snapshot/coded-capture.js';
export type { RegionMemory, MappedMemory } from './regions/memory.js';
// a value here too: RegionMemory names it, and a declaration at the root must exist at run time
export { DeviceAllocation } from './gpu/device-allocation.js';
export type { TransferOptions, TransferProgress } from './transfer/transfer.js';
export type { MultipathOptions, MultipathPathTimeline, MultipathStats, MultipathTimeline } from './transfer/multipath.js';
export type { LiveCheckReport } from './digest/compare.js';

export { RamTier, type RamEntry, type RamTierOptions } from './cache/ram-tier.js';
export { GpuTier, type GpuEntry } from './cache/gpu-tier.js';
export {
  NeighbourTier,
  type NeighbourEntry,
  type NeighbourParkOptions,
  type NeighbourParkResult,
  type NeighbourRegion,
  type NeighbourTierOptions,
  type NeighbourTransfer,
} from './cache/neighbour-tier.js';
export type { EngineTierOptions, EngineTiers, TierName } from './tiers/index.js';

export { RegistryClient } from './registry/registry.js';
export type { RegistryReference } from './registry/reference.js';
export type { RegistryConnectOptions, RegistryTimeouts } from './registry/http.js';
export type { RegistryCredentials } from './registry/auth.js';
export type { PullCompatibility, PullOptions, PullReport, PushOptions, PushReport, RegistryOptions, RegistryProgress } from './registry/types.js';
export type { RegistrySource } from './registry/source.js';

export { EngineClient, type CallOptions, type CompletionResult, type EngineClientOptions, type EngineDigestTable, type EngineRegionTable, type EngineStatus, type QueuedRequestsPolicy } from './engine/engine-client.js';
export type { ResponseCheckOptions } from './engine/response-check.js';

export { captureEngine, EngineSession, restorableFor, restoreEngine, suspendEngine, swapEngines } from './flows/index.js';
export type {
  DeepSuspendOptions,
  EngineCaptureOptions,
  EngineTierSuspendResult,
  EngineMove,
  EngineRecovery,
  EngineRestoreOptions,
  EngineRestoreReport,
  EngineSessionOptions,
  EngineSessionSwapOptions,
  EngineSessionTiers,
  EngineSuspendOptions,
  EngineSuspendResult,
  EngineSwapOptions,
  EngineSwapReport,
  GpuRef,
  MaterializeOutcome,
  MaterializePolicy,
  RecoveryOptions,
  RecoveryPolicy,
  RecoveryReason,
  RestorePhase,
  RestorePhases,
  RestoreRoute,
  RestoreVerification,
  SnapshotRef,
  SwapOverlap,
  TransferTuning,
} from './flows/index.js';

export { SwapController } from './swap/controller.js';
export type {
  EngineState,
  EngineView,
  Lease,
  NeighbourView,
  RecoveryView,
  SwapControllerOptions,
  SwapEngine,
  SwapEvent,
  SwapNeighbourOptions,
  SwapQueueOptions,
  SwapTiers,
} from './swap/types.js';
export type {
  MaterializedEvent,
  MaterializeFailedEvent,
  NeighbourEvictedEvent,
  ParkedEvent,
  RecoveredEvent,
  SnapshotDamagedEvent,
  SwapControllerEvents,
  SwapFailedEvent,
  SwapStartedEvent,
  SwapWarningEvent,
} from './swap/events.js';
