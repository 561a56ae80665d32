import { VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import type { RegionStore } from '../store/region-store.js';
import { checkSpec, probe } from '../engine/response-check.js';
import { checkOptions } from '../options.js';
import { preflight } from './checks.js';
import { liveRefs, mapExported } from '../engine/exported.js';
import type { MappedRegions } from '../regions/mapped.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { EngineCaptureOptions } from './types.js';
/* captureEngine: a running engine's weights into a snapshot, through its vsnap plugin. */

/**
 * Captures a running engine's weights through its vsnap plugin: records a short greedy
 * completion (the expected response), has every worker export its weights regions, copies them
 * out per rank in parallel, and publishes the snapshot with the engine, model and platform facts.
 * @public
 */
export async function captureEngine(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: EngineCaptureOptions = {},
): Promise<Snapshot> {
  checkCaptureOptions(options);
  const { control, status } = await engineControl(client, options.signal ? { signal: options.signal } : {});
  preflight(status, options);
  if (status.sleeping) {
    throw new VsnapError('E_ENGINE_STATE', 'the engine is asleep: capture needs its weights awake (restore or wake it first)');
  }
  const exported = await exportRegions(control, status.ranks.length, options.signal ? { signal: options.signal } : {});
  let mapped: MappedRegions | undefined;
  try {
    // Mapped once: the capture's GPU digests and its copy share the mappings.
    mapped = await mapExported(exported);
    return await captureExported(store, name, client, status, exported, options, mapped);
  } finally {
    exported.close();
    await mapped?.close();
  }
}

/** Records the expected response and captures the regions the engine exported (left open). @internal */
export async function captureExported(
  store: RegionStore,
  name: string,
  client: EngineClient,
  status: EngineStatus,
  exported: ExportedRegions,
  options: EngineCaptureOptions,
  mapped?: MappedRegions,
): Promise<Snapshot> {
  const expected = await probe(client, checkSpec(options.check), options.signal);
  const memory = liveRefs(exported, mapped).map((l) => l.memory);
  let i = 0;
  return Snapshot.capture(store, name, {
    regions: exported.ranks.flatMap((r) =>
      r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag, rank: x.rank, memory: memory[i++]!, tensors: x.tensors, ...(x.device !== undefined ? { device: x.device } : {}) })),
    ),
    engine: status.engine,
    model: status.model,
    expectedResponse: expected,
    labels: { ...(options.labels ?? {}) },
    ...(options.chunkSize ? { chunkSize: options.chunkSize } : {}),
    ...(options.ram ? { ram: options.ram } : {}),
    ...(options.persist ? { persist: options.persist } : {}),
    ...(options.hash ? { hash: options.hash } : {}),
    ...(options.base ? { base: options.base } : {}),
    ...(options.codec ? { codec: options.codec } : {}),
    ...(options.transfer?.threads ? { threads: options.transfer.threads } : {}),
    ...(options.transfer?.onProgress ? { onProgress: options.transfer.onProgress } : {}),
    ...(options.signal ? { signal: options.signal } : {}),
  });
}

const CAPTURE_OPTIONS = ['check', 'labels', 'chunkSize', 'ram', 'persist', 'hash', 'base', 'codec', 'transfer', 'signal', 'onWarning'];

/** Rejects unknown capture options (the probe options moved into `check`). @internal */
export function checkCaptureOptions(options: EngineCaptureOptions, what = 'captureEngine options'): void {
  checkOptions(what, options, CAPTURE_OPTIONS);
  checkOptions(`${what}.transfer`, options.transfer, ['threads', 'onProgress']);
}

