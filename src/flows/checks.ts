// What the engine flows check and compare, kept apart from the flows themselves (all @internal).
import { statSync } from 'node:fs';

import { invalidArgument, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import type { RegionTables } from '../engine/region-table.js';
import type { LiveLayout } from '../manifest/compat.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import { storedBytes } from '../store/coded-blob.js';


const RISKY_BACKENDS = /FLASHINFER/i;
export function warn(options: { onWarning?: (m: string) => void }, message: string): void {
  if (options.onWarning) options.onWarning(message);
  else process.emitWarning(message, { code: 'VSNAP_ENGINE' });
}

export function preflight(status: EngineStatus, options: { onWarning?: (m: string) => void }): void {
  const backend = status.engine.attentionBackend;
  if (backend && RISKY_BACKENDS.test(backend)) {
    warn(
      options,
      `the engine uses the ${backend} attention backend, which keeps workspace outside the sleep-mode allocator: ` +
        'after a wake its output can be fluent but wrong (vllm #31016). Serve with --attention-backend TRITON_ATTN; ' +
        'the expected-response check after each restore will catch the fault.',
    );
  }
  const off = status.ranks.filter((r) => !r.sleepMode);
  if (off.length) {
    const cumem = off.some((r) => r.cumemAllocator);
    throw new VsnapError(
      'E_ENGINE_STATE',
      `the engine runs without sleep mode${cumem ? ' (its weights are in the cumem pool of --enable-cumem-allocator, which is not sleep mode)' : ''}: start it with --enable-sleep-mode`,
      { ranks: off.map((r) => r.rank) },
    );
  }
}

/** The engine, model and platform facts a snapshot must match. */
export function liveFacts(status: EngineStatus, exported: RegionTables, allowModelSwap: boolean): Omit<LiveLayout, 'ranks'> {
  const m = status.model;
  const model = allowModelSwap
    ? { dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize }
    : { id: m.id, revision: m.revision, dtype: m.dtype, quantization: m.quantization, tensorParallelSize: m.tensorParallelSize, pipelineParallelSize: m.pipelineParallelSize };
  const engine = { kind: status.engine.kind, version: status.engine.version, pluginVersion: status.engine.pluginVersion, attentionBackend: status.engine.attentionBackend };
  const first = exported.ranks[0]!;
  if (first.memory === 'host') return { engine, model, platform: { kind: 'host' } };
  const device = first.gpu; // found by the export (or describe)
  return {
    engine,
    model,
    platform: { kind: 'cuda', gpuName: device?.name ?? null, computeCapability: device?.computeCapability ?? null, vmmGranularity: device?.vmmGranularity ?? null },
  };
}

export function liveRanks(exported: RegionTables): LiveLayout['ranks'] {
  return exported.ranks.map((r) => ({ regions: r.regions.map((x) => ({ key: x.key, size: x.size, tag: x.tag })) }));
}

/** Whether an engine holds any weights memory now (awake, or woken part way). */
export function holdsWeights(status: EngineStatus): boolean {
  return !status.sleeping || status.ranks.some((r) => r.weightsMapped);
}

/** The snapshot's blobs that are missing or of the wrong size, as problems. @internal */
export function blobProblems(snapshot: Snapshot): string[] {
  const problems: string[] = [];
  for (const { region } of snapshot.manifest.regions()) {
    let size: number | undefined;
    try {
      size = statSync(snapshot.store.blobPath(region.blob)).size;
    } catch {
      size = undefined;
    }
    const expected = storedBytes(region);
    if (size !== expected) problems.push(`blob of region ${JSON.stringify(region.key)} is ${size === undefined ? 'missing' : `${size} bytes, not ${expected}`}`);
  }
  return problems;
}

/**
 * A stopwatch for phases: each call records the seconds since the previous one (the first: since
 * `from`, default now) under `name`; `restart()` starts the next phase now (time spent in
 * between is not counted).
 */
export function phaseTimer(into: Record<string, number>, from = performance.now()): ((name: string) => void) & { restart(): void } {
  let mark = from;
  const lap = (name: string): void => {
    const now = performance.now();
    into[name] = (now - mark) / 1000;
    mark = now;
  };
  return Object.assign(lap, { restart: () => void (mark = performance.now()) });
}
