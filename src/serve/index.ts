/**
 * `vsnap/serve`: the `vsnap serve` application as a library: its configuration, the supervisor
 * that starts and stops engine processes, the HTTP agent (an OpenAI-compatible proxy that swaps
 * models, with a status page and control routes), and `serve`, which runs them all. The classes
 * its signatures name (SwapController, RegionStore, RamTier) are vsnap's root exports.
 *
 * @packageDocumentation
 */

export { serve, type ServeHandle, type ServeOptions } from './serve.js';
export type { ModelPhase, ModelReadiness, ModelReadinessSource } from './model-readiness.js';
export { checkPorts, loadConfig, snapshotNameForModel, type ServeConfig, type ServeModelConfig } from './config.js';
export { Supervisor, type EngineProcessState, type SupervisedEngine, type SupervisorOptions } from './supervisor.js';
export { SwapAgent, type SwapAgentOptions } from './agent.js';
