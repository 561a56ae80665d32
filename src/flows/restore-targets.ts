import { exportRegions, type ExportedRegions } from '../engine/export.js';
import { liveRefs, mapExported } from '../engine/exported.js';
import type { MappedRegionsOptions } from '../regions/mapped.js';
import type { FilledTargets, MappedTargets } from '../tiers/tier.js';
import { liveFacts, liveRanks } from './checks.js';
import type { FillMemory } from './fill.js';
import { startFill } from './fill-targets.js';
import { checkMoved } from './gpu-remap.js';
import { startKvWake } from './kv-overlap.js';
import type { EarlyPart, RestoreContext } from './restore-stage.js';

/*
 * A restore's targets, in one of two forms: memory made here and filled while the engine's wake
 * adopts it (the default), or the engine's own weights woken, exported and mapped here (where
 * memory made here cannot be adopted). Each moves the run to its stage as it goes, so what was made
 * is let go on every path.
 */

/**
 * How a restore maps the engine's regions: pipelined (the copy starts on the first regions while
 * the rest are imported; measured on the H200 the fastest form at every region count, 36 to 4,000:
 * bench/results/2026-12-01-h200-region-count.log).
 * @internal
 */
export const RESTORE_MAPPING: MappedRegionsOptions = { mapping: 'pipelined' };

/** The tags a restore wakes after the weights: the KV cache, by name, alone (restore-finish.ts says why). @internal */
export const TAGS_AFTER_WEIGHTS: readonly string[] = ['kv_cache'];

/** The signal that stops a hydrate: the restore's, and `stop`'s (a wake beside it failed). */
function hydrateSignal(run: RestoreContext, stop: AbortController): AbortSignal {
  return run.call.signal ? AbortSignal.any([run.call.signal, stop.signal]) : stop.signal;
}

/** The weights' targets made here (fill-targets.ts), the engine's wake of them beside the hydrate. @internal */
export async function filledTargets(run: RestoreContext, early: EarlyPart): Promise<FilledTargets> {
  const memory: FillMemory[] = [];
  const beside: Record<string, number> = {};
  run.stage = { stage: 'filling', early, memory };
  const started = await startFill({
    control: run.control,
    status: run.status,
    manifest: run.snapshot!.manifest,
    call: run.call,
    allowModelSwap: run.options.allowModelSwap ?? false,
    lap: run.lap,
    overlapped: (phase, seconds) => void (beside[phase] = seconds),
    ...(run.plan.kvBesideHydrate ? { kvWake: { tags: TAGS_AFTER_WEIGHTS, before: run.hooks.beforeKvWake } } : {}),
    made: (fill) => void memory.push(fill),
    ...(early ? { early } : {}),
  });
  run.stage = { stage: 'filled', early, memory, targets: started.targets, wake: started.wake, kvWake: started.early, beside };
  return started.targets;
}

/** The engine's weights woken (where they are not), exported, checked against the snapshot and mapped here. @internal */
export async function mappedTargets(run: RestoreContext, early: EarlyPart): Promise<MappedTargets> {
  await (await early)?.close(); // memory made before the engine was read, which this form cannot use
  if (run.status.ranks.some((r) => !r.weightsMapped)) await run.control.wake(['weights'], run.call);
  run.lap('wakeWeights');
  const exported = await exportRegions(run.control, run.status.ranks.length, run.call);
  run.stage = { stage: 'exported', exported };
  run.lap('export');
  if (run.remap) checkMoved(exported, run.remap);
  run.snapshot!.manifest.assertCompatible({ ...liveFacts(run.status, exported, run.options.allowModelSwap ?? false), ranks: liveRanks(exported) });
  run.lap('validate');
  // Mapped once, on a few threads: the hydrate and the GPU digest that verifies it share the mappings.
  const mapped = await mapExported(exported, RESTORE_MAPPING);
  const live = liveRefs(exported, mapped);
  run.lap('map');
  // With overlapKvWake the KV cache wakes now; its failure stops the hydrate (and the other way
  // round, a failure waits for it before the engine goes back to sleep).
  const stop = new AbortController();
  const kvWake = run.plan.kvBesideHydrate ? startKvWake(run.control, TAGS_AFTER_WEIGHTS, run.call, run.hooks.beforeKvWake, (e) => stop.abort(e)) : undefined;
  const regions = live.map((x, i) => ({ key: x.key, size: x.size, tag: exportedTag(exported, i), rank: x.rank, memory: x.memory }));
  const targets: MappedTargets = { kind: 'mapped', direct: liveRefs(exported), mapped: live, regions, signal: kvWake ? hydrateSignal(run, stop) : run.call.signal, ranks: exported.ranks.length };
  run.stage = { stage: 'mapped', exported, mapped, targets, kvWake };
  return targets;
}

/** The tag of the i-th exported region (rank by rank, in the order sent). */
function exportedTag(exported: ExportedRegions, i: number): string {
  for (const r of exported.ranks) {
    if (i < r.regions.length) return r.regions[i]!.tag;
    i -= r.regions.length;
  }
  throw new RangeError(`exported region ${i}`);
}
