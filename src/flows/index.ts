// The engine flows' one import path: capture, suspend, restore and swap a running engine.
export { captureEngine } from './capture.js';
export { restorableFor, suspendEngine } from './suspend.js';
export { restoreEngine } from './restore.js';
export { EngineSession, type EngineSessionOptions, type EngineSessionSwapOptions, type EngineSessionTiers } from './session.js';
export { swapEngines, type EngineSwapOptions, type EngineSwapReport, type SwapOverlap } from './swap.js';
export type * from './types.js';
export type { EngineRecovery, MaterializeOutcome, MaterializePolicy, RecoveryPolicy, RecoveryReason } from './recovery.js';
export type { GpuRef } from './gpu-remap.js';
export type { RestorePhase, RestorePhases, RestoreRoute } from './phases.js';
