/**
 * vsnap: suspend and restore LLM inference engines on a GPU in well under a second.
 *
 * @packageDocumentation
 */

export { VERSION } from './version.js';
export { VsnapError, type ErrorCode } from './errors.js';

export { cudaStatus, listDevices, type CudaStatus, type GpuDevice } from './gpu/cuda.js';
export { DeviceAllocation } from './gpu/device-allocation.js';
export { NeighbourTier } from './gpu/neighbour-tier.js';
export type { NeighbourEntry, NeighbourRegion, NeighbourTierOptions, NeighbourTransfer } from './gpu/neighbour-tier.js';
export type { NeighbourParkOptions, NeighbourParkResult } from './snapshot/neighbour-flows.js';
export type { NeighbourView, SwapNeighbourOptions } from './swap/neighbour-parking.js';

export { HostRegion } from './regions/host-region.js';
export { MappedRegions, type MappedRegionsOptions } from './regions/mapped.js';
export type { MappedMemory, RegionMemory } from './regions/memory.js';

export { releaseIdleResources } from './transfer/staging.js';
export { HostCache, type HostCacheOptions, type CacheEntryInfo } from './cache/host-cache.js';
export { ResidentWeights, type ResidentInfo } from './cache/resident-weights.js';
export type { TransferOptions, TransferProgress } from './transfer/transfer.js';
export type { MultipathOptions, MultipathPathTimeline, MultipathStats, MultipathTimeline } from './transfer/multipath.js';

export { FdReceiver, fetchFds, sendFds, type FdMessage } from './ipc/fd-receiver.js';

export { Manifest, type ManifestIssue } from './manifest/manifest.js';
export { DIGEST_ALGORITHM } from './digest/index.js';
export type { LiveCheckReport } from './snapshot/live-check.js';
export type { LiveLayout, LiveRegion, Mismatch } from './manifest/compat.js';
export type {
  EngineInfo,
  ExpectedResponse,
  ManifestData,
  ModelInfo,
  PlatformInfo,
  RankInfo,
  RegionInfo,
  TensorInfo,
} from './manifest/types.js';

export {
  RegionStore,
  type RegionStoreOptions,
  type SnapshotList,
  type SnapshotSummary,
  type StoreProblem,
  type VerifyProblem,
  type VerifyReport,
} from './store/region-store.js';
export { Registry } from './registry/registry.js';
export { parseReference, type RegistryReference } from './registry/reference.js';
export { SNAPSHOT_ARTIFACT_TYPE } from './registry/artifact.js';
export type { RegistryConnectOptions, RegistryTimeouts } from './registry/http.js';
export type { RegistryCredentials } from './registry/auth.js';
export type {
  PullCompatibility,
  PullOptions,
  PullReport,
  PushOptions,
  PushReport,
  RegistryOptions,
  RegistryProgress,
} from './registry/types.js';
export type { RegistrySource } from './registry/source.js';

export {
  EngineClient,
  type CallOptions,
  type CompletionResult,
  type EngineClientOptions,
  type EngineStatus,
  type QueuedRequestsPolicy,
} from './engine/engine-client.js';
export {
  captureEngine,
  restorableFor,
  restoreEngine,
  suspendEngine,
  type EngineCaptureOptions,
  type EngineRestoreOptions,
  type EngineRestoreReport,
  type EngineSuspendOptions,
  type EngineSuspendResult,
  type SnapshotRef,
} from './snapshot/engine-flows.js';
export { swapEngines, type EngineSwapOptions, type EngineSwapReport, type SwapOverlap } from './snapshot/engine-swap.js';
export type { EngineRecovery, MaterializeOutcome, MaterializePolicy, RecoveryPolicy, RecoveryReason } from './snapshot/engine-recovery.js';
export type { GpuRef } from './snapshot/gpu-remap.js';
export {
  resumeEngineKeptWeights,
  suspendEngineKeepingWeights,
  type KeepWeightsSuspendOptions,
  type KeepWeightsSuspendResult,
} from './snapshot/engine-kv-release.js';
export type { ResponseCheckOptions } from './snapshot/response-check-options.js';

export { Snapshot } from './snapshot/snapshot.js';
export type {
  CaptureOptions,
  CaptureRegion,
  PersistPolicy,
  CaptureHash,
  RestoreOptions,
  RestoreRegion,
  TransferSummary,
  DeviceTiming,
} from './snapshot/snapshot-types.js';

export {
  SwapController,
  type EngineState,
  type EngineView,
  type Lease,
  type RecoveryView,
  type SwapControllerOptions,
  type SwapEngine,
  type SwapEvent,
} from './swap/controller.js';
export { SwapAgent, type SwapAgentOptions } from './swap/agent.js';
export { Supervisor, type EngineProcessState, type SupervisedEngine, type SupervisorOptions } from './swap/supervisor.js';
export { checkPorts, loadConfig, snapshotNameForModel, type ServeConfig, type ServeModelConfig } from './swap/config.js';
export { serve, type ServeHandle, type ServeOptions } from './swap/serve.js';
export type { ModelPhase, ModelReadiness, ModelReadinessSource } from './swap/model-readiness.js';
