import { toVsnapError } from '../errors.js';
import type { CallOptions, EngineStatus } from '../engine/engine-client.js';
import type { EngineControl } from '../engine/control.js';
import { describeRegions } from '../engine/describe.js';
import { handOver } from '../engine/hand-over.js';
import type { RegionTables } from '../engine/region-table.js';
import type { Manifest } from '../manifest/manifest.js';
import { regionId } from '../manifest/region-id.js';
import type { EarlyRestore } from '../snapshot/early-restore.js';
import { Batches } from '../snapshot/batches.js';
import type { RestoreRegion } from '../snapshot/snapshot-types.js';
import type { StagedRest } from '../snapshot/staged.js';
import type { FilledTargets } from '../tiers/tier.js';
import { liveFacts, liveRanks } from './checks.js';
import { earlyFits, fillHandOver, fillRegions, firstRegions, makeFillMemory, makeFillMemoryInParts, type EarlyFill, type FillMemory } from './fill.js';
import { startKvWake, type EarlyWake } from './kv-overlap.js';

/*
 * A restore's targets made here (fill.ts): the sleeping engine's region table read and checked
 * against the snapshot while the memory is made, then the engine's wake of its weights started with
 * that memory to adopt, beside the hydrate that fills it.
 */

/** The engine's wake of its weights, mapping memory made here, running beside the hydrate. @internal */
export interface FillWake {
  /** Resolves once the engine has mapped the memory; rejects with why not (or why the wake never started: the table did not match). */
  readonly done: Promise<void>;
  /** Settles with `done`, never rejects. */
  readonly settled: Promise<void>;
}

/** The phases a filled restore runs beside its hydrate, in the order the report lists them. @internal */
export const FILL_OVERLAPPED = ['describe', 'validate', 'allocateRest', 'wakeWeights'] as const;

/** What startFill needs of the restore. @internal */
export interface FillStart {
  readonly control: EngineControl;
  readonly status: EngineStatus;
  readonly manifest: Manifest;
  readonly call: CallOptions;
  readonly allowModelSwap: boolean;
  lap(phase: string): void;
  /** Records a phase that ran beside the hydrate, with its own seconds. */
  overlapped(phase: string, seconds: number): void;
  /** With overlapKvWake: the KV cache's wake, started once the weights' is done. */
  readonly kvWake?: { readonly tags: readonly string[]; readonly before: (() => Promise<void>) | undefined };
  /** Told each part of the memory as soon as it is made (the restore lets go of it on every path from then on). */
  made(fill: FillMemory): void;
  /** The first part made before the engine was read (EarlyFill), taken where it fits; one that does not is let go here. */
  readonly early?: Promise<EarlyFill | undefined>;
}

/**
 * Makes the targets in two parts (fill.ts): the memory of the largest regions, whose copy starts as
 * soon as it is made, then, beside that copy, the engine's table read and checked against the
 * snapshot while the rest of the memory is made, and the engine's wake of its weights started with
 * all of it to adopt. A table that does not match refuses the restore before the engine is
 * touched (the copy into memory made here stops, and the memory is let go). A failed wake stops
 * the hydrate (the targets' signal), and the regions the wake writes into are filled after it
 * (copied again if they were among the first).
 * @internal
 */
export async function startFill(run: FillStart): Promise<{ targets: FilledTargets; wake: FillWake; early: EarlyWake | undefined }> {
  const wanted = await fillRegions(run.manifest, run.status);
  const firstIds = firstRegions(wanted);
  const made = await run.early;
  let first: FillMemory;
  let started: EarlyRestore | undefined; // the first part's copy, started while the engine was read
  if (made && earlyFits(made, wanted, firstIds)) {
    first = made.memory;
    started = made.copy;
  } else {
    await made?.close();
    first = await makeFillMemory(wanted.filter((w) => firstIds.has(regionId(w.rank, w.key))));
  }
  run.made(first);
  run.lap('allocate'); // the first part's memory: what stands before the copy
  const stop = new AbortController();
  // The rest's memory part by part, each copied as it comes (the regions holding a tensor of the model).
  const more = new Batches<readonly RestoreRegion[]>();
  const rest = (async (): Promise<StagedRest> => {
    const started = performance.now();
    const making = makeFillMemoryInParts(
      wanted.filter((w) => !firstIds.has(regionId(w.rank, w.key))),
      (m) => {
        run.made(m);
        more.send(m.regions);
      },
    ).then(
      (parts) => {
        more.end();
        run.overlapped('allocateRest', (performance.now() - started) / 1000);
        return parts;
      },
      (err: unknown) => {
        more.fail(err);
        throw err;
      },
    );
    making.catch(() => undefined); // awaited below on every path
    let tables: RegionTables;
    try {
      tables = await describeRegions(run.control, run.status.ranks.length, run.call);
      run.overlapped('describe', (performance.now() - started) / 1000);
      const checking = performance.now();
      run.manifest.assertCompatible({ ...liveFacts(run.status, tables, run.allowModelSwap), ranks: liveRanks(tables) });
      run.overlapped('validate', (performance.now() - checking) / 1000);
    } catch (err) {
      await making.catch(() => undefined); // what was made is the restore's to let go (made)
      throw err;
    }
    const parts = await making;
    const { ranks, wakeWrites } = fillHandOver(tables, [first, ...parts]);
    const waking = performance.now();
    const adopted = handOver(ranks, (adopt) => run.control.wake(['weights'], run.call, adopt), run.call).then(() =>
      run.overlapped('wakeWeights', (performance.now() - waking) / 1000),
    );
    return { regions: parts.flatMap((p) => p.regions), late: { ids: wakeWrites, after: adopted } };
  })();
  // The wake adopts the memory once the rest is made and the table checked; either failing stops the hydrate.
  const done = rest.then((r) => r.late.after);
  done.catch((err: unknown) => stop.abort(toVsnapError(err)));
  const wake: FillWake = { done, settled: done.then(() => undefined, () => undefined) };
  const early = run.kvWake ? startKvWake(run.control, run.kvWake.tags, run.call, run.kvWake.before, (e) => stop.abort(e), done) : undefined;
  const signal = run.call.signal ? AbortSignal.any([run.call.signal, stop.signal]) : stop.signal;
  return { targets: { kind: 'filled', regions: first.regions, signal, ranks: run.status.ranks.length, stages: { first: firstIds, rest, more, ...(started ? { started } : {}) } }, wake, early };
}
