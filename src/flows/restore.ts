import { VsnapError } from '../errors.js';
import type { EngineClient } from '../engine/engine-client.js';
import type { Manifest } from '../manifest/manifest.js';
import { checkOptions } from '../options.js';
import { ENGINE_TIER_KEYS, TIER_KEYS } from '../tiers/index.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import { captureEngine } from './capture.js';
import { recoverEngine, recoveryReason, type RecoveryReason } from './recovery.js';
import { restoreError } from './restore-failure.js';
import { openRestore, prepareEngine } from './restore-open.js';
import type { EngineRestoreRun } from './restore-run.js';
import type { FlowHooks } from './hooks.js';
import type { EngineRestoreOptions, EngineRestoreReport, SnapshotRef } from './types.js';

/*
 * restoreEngine: the order of its steps. The run and its stage are restore-run.ts's, the steps
 * restore-open.ts, restore-targets.ts and restore-finish.ts; where the weights come from is the
 * tiers' (src/tiers): the first that holds them serves them.
 */

const RESTORE_OPTIONS = ['tiers', 'recovery', 'move', 'verify', 'overlapKvWake', 'allowModelSwap', 'transfer', 'signal', 'onWarning'];

/**
 * Restores a snapshot into a suspended engine: wakes the weights, has the workers export them,
 * checks the layout and facts, hydrates with every chunk verified, wakes the KV cache, resets the
 * prefix cache, and re-runs the expected response; only then does it resolve. The weights come
 * from the first of `tiers` that holds them (tier 0 maps them back; a neighbour GPU or the RAM
 * tier copies them), else from the store. Any failure puts an engine that woke back to sleep and
 * says how to recover. With `recovery: 'reload'`, a snapshot that cannot be used (missing,
 * damaged, incompatible, RAM copy lost) is replaced by the engine's own reload of its weights
 * (see {@link RecoveryReason}).
 *
 * The store's lock is held, shared, for the whole restore: a `gc` (`vsnap rm`) waits for it to
 * end. Given a {@link SnapshotRef}, the manifest is read under that lock too; a `Snapshot` opened
 * earlier was read before it, and a gc run in between may have deleted its blobs (E_BLOB_MISSING).
 * @public
 */
export function restoreEngine(source: Snapshot | SnapshotRef, client: EngineClient, options: EngineRestoreOptions = {}): Promise<EngineRestoreReport> {
  return restoreEngineWith(source, client, options, {});
}

/**
 * {@link restoreEngine} with the flows' seams (hooks.ts): a swap's gate between its two engines, a
 * test's fake checkpoint driver or fault.
 * @internal
 */
export async function restoreEngineWith(source: Snapshot | SnapshotRef, client: EngineClient, options: EngineRestoreOptions, hooks: FlowHooks): Promise<EngineRestoreReport> {
  checkOptions('restoreEngine options', options, RESTORE_OPTIONS);
  checkOptions('restoreEngine options.tiers', options.tiers, TIER_KEYS);
  if (typeof options.tiers?.engine === 'object') checkOptions('restoreEngine options.tiers.engine', options.tiers.engine, ENGINE_TIER_KEYS);
  checkOptions('restoreEngine options.move', options.move, ['onto', 'gpuMap', 'reserveBytes']);
  checkOptions('restoreEngine options.verify', options.verify, ['blobs', 'digests', 'logprobTolerance']);
  checkOptions('restoreEngine options.transfer', options.transfer, ['threads', 'directIo', 'onProgress']);
  // The store's blob lock, shared, from before the manifest is read to the flow's end (every path):
  // a gc (`vsnap rm`) waits meanwhile instead of deleting the blobs this restore is about to read.
  return source.store.withLock(false, async () => {
    const run = await openRestore(source, client, options, hooks);
    try {
      return await restoreWith(run, options);
    } finally {
      await run.releaseEarly(); // memory made before the engine was read, where nothing took it
    }
  });
}

/** restoreEngine's steps once the snapshot is open and the engine read. */
async function restoreWith(run: EngineRestoreRun, options: EngineRestoreOptions): Promise<EngineRestoreReport> {
  await prepareEngine(run);
  const kept = run.tiers.find((t) => t.name === 'engine');
  if (kept?.holds(run)) {
    await run.copyOver(false);
    return run.report((await kept.restore(run))!, 'engine'); // the engine's own weights: nothing else may replace them
  }
  if (run.openError) {
    await run.copyOver(true);
    for (const tier of run.tiers) tier.release?.(run); // what tier 0 held cannot be checked against a snapshot that cannot be read
    if (!run.openError.reason || run.status.ranks.some((r) => r.reloadWeights === false)) throw run.openError.error;
    return recover(run, run.openError.error, run.openError.reason, undefined);
  }
  try {
    for (const tier of run.tiers) {
      let outcome;
      try {
        if (tier.holds(run)) outcome = await tier.restore(run);
      } finally {
        tier.release?.(run);
      }
      if (!outcome) continue;
      await run.copyOver(false);
      if (!outcome.finished) await run.afterHydrate(outcome);
      return run.report(outcome, tier.name);
    }
    throw new VsnapError('E_INTERNAL', `no tier could restore '${run.name}'`);
  } catch (err) {
    await run.copyOver(true);
    const e = await run.cleanUp(err);
    // The snapshot's own faults (never the engine's, nor a cancellation) may be recovered from.
    const manifest = run.snapshot!.manifest;
    const reason = run.plan.recovery.reload && !run.call.signal?.aborted ? recoveryReason(e, manifest, run.status, options) : undefined;
    if (reason) return recover(run, e, reason, manifest);
    const { state, asleep } = await run.backToSleep();
    throw restoreError(
      e.code,
      `${e.message}\nRestore of '${run.name}' failed; ${state}. Retry the restore, or wake the engine and reload its weights with vLLM's reload_weights (restoreEngine's recovery: 'reload').`,
      e.details,
      e,
      { engineAsleep: asleep },
    );
  }
}

/** The engine reloads its weights itself (the snapshot cannot be used), then follows the materialize policy. */
async function recover(run: EngineRestoreRun, cause: VsnapError, reason: RecoveryReason, manifest: Manifest | undefined): Promise<EngineRestoreReport> {
  const { options } = run;
  run.warn(`snapshot '${run.name}' cannot be used (${cause.code}); the engine reloads its weights itself`);
  const outcome = await recoverEngine({
    control: run.control,
    client: run.client,
    store: run.store,
    name: run.name,
    manifest,
    cause,
    reason,
    materialize: run.plan.recovery.materialize,
    call: run.call,
    lap: run.lap,
    onWarning: options.onWarning,
    finishWake: (expected) => run.finishWake(expected, 'recovered'),
    backToSleep: () => run.backToSleep(),
    capture: (probe) =>
      captureEngine(run.store, run.name, run.client, {
        ...(probe ? { check: { prompt: probe.prompt, maxTokens: probe.maxTokens, mode: probe.promptLogprobs ? 'prefill' : 'decode' } } : {}),
        ...(options.tiers?.ram ? { ram: options.tiers.ram } : {}),
        ...(run.plan.recovery.codec !== 'off' ? { codec: run.plan.recovery.codec } : {}),
        ...(options.onWarning ? { onWarning: options.onWarning } : {}),
        ...(options.transfer ? { transfer: { ...(options.transfer.threads ? { threads: options.transfer.threads } : {}), ...(options.transfer.onProgress ? { onProgress: options.transfer.onProgress } : {}) } } : {}),
        ...(options.signal ? { signal: options.signal } : {}),
      }),
  });
  return { bytes: outcome.bytes, tier: 'engine', seconds: (performance.now() - run.started) / 1000, route: 'reloaded', phases: run.phases, path: 'recovered', recovery: outcome.recovery };
}
