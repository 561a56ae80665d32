import { toVsnapError, VsnapError } from '../errors.js';
import type { CallOptions, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import { describeRegions } from '../engine/describe.js';
import { handOver } from '../engine/hand-over.js';
import type { RegionTables } from '../engine/region-table.js';
import type { Manifest } from '../manifest/manifest.js';
import type { HydrateTargets } from '../tiers/tier.js';
import { liveFacts, liveRanks } from './checks.js';
import { fillRegions, makeFillMemory, type FillMemory } from './fill.js';
import { startKvWake, type EarlyWake } from './kv-overlap.js';

/*
 * A restore's targets made here (fill.ts): the sleeping engine's region table read and checked
 * against the snapshot while the memory is made, then the engine's wake of its weights started with
 * that memory to adopt, beside the hydrate that fills it.
 */

/**
 * Where a hydrate's target memory comes from: `fill` (the default), memory made here and filled
 * while the engine's wake maps it, or `wake`, the engine's wake first and then its export, mapped
 * here. VSNAP_RESTORE_TARGETS=wake chooses the second (for comparison, or a plugin whose wake
 * cannot adopt).
 * @internal
 */
export function restoreTargets(): 'fill' | 'wake' {
  const v = process.env.VSNAP_RESTORE_TARGETS;
  if (v === undefined || v === '' || v === 'fill') return 'fill';
  if (v === 'wake') return 'wake';
  throw new VsnapError('E_CONFIG', `VSNAP_RESTORE_TARGETS=${JSON.stringify(v)}: expected 'fill' (the default) or 'wake'`, { value: v });
}

/** The engine's wake of its weights, mapping memory made here, running beside the hydrate. @internal */
export interface FillWake {
  readonly done: Promise<void>;
  /** Settles with `done`, never rejects. */
  readonly settled: Promise<void>;
  /** Its seconds, once done (recorded as the `wakeWeights` phase after the hydrate, so the phases keep one order). */
  seconds?: number;
}

/** What startFill needs of the restore. @internal */
export interface FillStart {
  readonly control: EngineControl;
  readonly status: EngineStatus;
  readonly manifest: Manifest;
  readonly call: CallOptions;
  readonly allowModelSwap: boolean;
  lap(phase: string): void;
  /** With overlapKvWake: the KV cache's wake, started once the weights' is done. */
  readonly kvWake?: { readonly tags: readonly string[]; readonly before: (() => Promise<void>) | undefined };
  /** Told the memory as soon as it is made (the restore lets go of it on every path from then on). */
  made(fill: FillMemory): void;
}

/**
 * Makes the targets: the memory made from the snapshot's sizes while the engine's table is read (a
 * table that does not match refuses the restore, and lets the memory go, before any byte moves),
 * then the engine's wake of its weights started with that memory to adopt. A failed wake stops the
 * hydrate (the targets' signal), and the regions the wake writes into are filled after it (`late`).
 * @internal
 */
export async function startFill(run: FillStart): Promise<{ targets: HydrateTargets; wake: FillWake; early: EarlyWake | undefined }> {
  const making = fillRegions(run.manifest, run.status).then(makeFillMemory);
  making.catch(() => undefined); // awaited (or let go) below on every path
  let tables: RegionTables;
  try {
    tables = await describeRegions(run.control, run.status.ranks.length, run.call);
    run.lap('describe');
    run.manifest.assertCompatible({ ...liveFacts(run.status, tables, run.allowModelSwap), ranks: liveRanks(tables) });
    run.lap('validate');
  } catch (err) {
    await making.then((f) => f.close(), () => undefined);
    throw err;
  }
  const fill = await making;
  run.made(fill);
  run.lap('allocate'); // what of making the memory the describe did not cover
  const { ranks, wakeWrites } = fill.handOver(tables);
  const stop = new AbortController();
  const started = performance.now();
  const done = handOver(ranks, (adopt) => run.control.wake(['weights'], run.call, adopt), run.call).then(
    () => void (wake.seconds = (performance.now() - started) / 1000),
    (err: unknown) => {
      const e = toVsnapError(err);
      stop.abort(e);
      throw e;
    },
  );
  const wake: FillWake = { done, settled: done.then(() => undefined, () => undefined) };
  const early = run.kvWake ? startKvWake(run.control, run.kvWake.tags, run.call, run.kvWake.before, (e) => stop.abort(e), done) : undefined;
  const signal = run.call.signal ? AbortSignal.any([run.call.signal, stop.signal]) : stop.signal;
  return { targets: { direct: fill.live, mapped: fill.live, regions: fill.regions, signal, ranks: tables.ranks.length, late: { ids: wakeWrites, after: done } }, wake, early };
}
