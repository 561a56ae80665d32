import { toVsnapError, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl, type EngineControl } from '../engine/control.js';
import { listDevices } from '../gpu/cuda.js';
import { pullIfMissing } from '../registry/source.js';
import { Snapshot } from '../snapshot/snapshot.js';
import type { RestoreRegion } from '../snapshot/snapshot-types.js';
import { preflight } from './checks.js';
import { resumeIfDeep } from './deep.js';
import { makeEarlyFill } from './fill.js';
import type { FlowHooks } from './hooks.js';
import { checkRoom, describeRoom, resolveRemap } from './gpu-remap.js';
import { recoveryReason } from './recovery.js';
import { recoveryChoice, planRestore, type RecoveryChoice } from './restore-plan.js';
import { EngineRestoreRun, type OpenError } from './restore-run.js';
import type { EngineRestoreOptions, SnapshotRef } from './types.js';

/*
 * A restore's first steps: the snapshot opened (pulled first where it has a registry source), the
 * first part of the weights' memory made (and copied into) while the engine is read, a move onto
 * other GPUs resolved, then the engine brought to a sleeping state the restore can fill.
 */

/**
 * Opens the snapshot, pulling it first when it has a registry source. One that cannot be opened
 * fails the restore, unless it may be recovered from (or the engine's own tier may hold the weights).
 */
async function openSnapshot(source: Snapshot | SnapshotRef, client: EngineClient, options: EngineRestoreOptions, recovery: RecoveryChoice, hooks: FlowHooks): Promise<{ snapshot?: Snapshot; openError?: OpenError }> {
  if ('manifest' in source) {
    hooks.opened?.(source);
    return { snapshot: source }; // structural: a Snapshot of the other build (ESM/CJS) too
  }
  try {
    await pullIfMissing(source, client, { signal: options.signal, allowModelSwap: options.allowModelSwap });
    const snapshot = await Snapshot.open(source.store, source.name, source.id !== undefined ? { id: source.id } : {});
    hooks.opened?.(snapshot);
    return { snapshot };
  } catch (err) {
    const error = toVsnapError(err);
    const reason = recovery.reload ? recoveryReason(error, undefined, undefined, options) : undefined;
    // Only the engine's own tier can restore without the snapshot; otherwise this is the end.
    if (!reason && !options.tiers?.engine) throw error;
    return { openError: { error, reason } };
  }
}

/**
 * Opens a restore before the engine is touched: the snapshot (one that cannot be opened fails here,
 * unless it may be recovered from), the first part of the weights' memory made while the engine is
 * read (where the RAM tier holds the snapshot, copied into at once: memory of this process's own,
 * so an engine that turns out not to match loses nothing), then a move onto other GPUs resolved
 * (checked before anything changes).
 * @internal
 */
export async function openRestore(source: Snapshot | SnapshotRef, client: EngineClient, options: EngineRestoreOptions, hooks: FlowHooks): Promise<EngineRestoreRun> {
  const started = performance.now();
  const recovery = recoveryChoice(options);
  const { snapshot, openError } = await openSnapshot(source, client, options, recovery, hooks);
  const plan = planRestore({ options, snapshot, engine: client.baseUrl, awaitsRoom: hooks.beforeKvWake !== undefined });
  const ram = options.tiers?.ram;
  const onProgress = options.transfer?.onProgress;
  const startCopy = snapshot && ram && plan.earlyCopy ? (regions: readonly RestoreRegion[]) => snapshot.startRestore(ram, regions, { onProgress, signal: options.signal }) : undefined;
  const early = snapshot && plan.earlyFill ? makeEarlyFill(snapshot.manifest, startCopy) : undefined;
  let control: EngineControl;
  let status: EngineStatus;
  try {
    ({ control, status } = await engineControl(client, options.signal ? { signal: options.signal } : {}));
    preflight(status, options);
  } catch (err) {
    await (await early)?.close();
    throw err;
  }
  const move = options.move;
  let remap;
  if (move?.onto !== undefined || move?.gpuMap !== undefined) {
    const onGpus = status.ranks.every((r) => r.memory === 'cuda'); // a host-memory engine is refused without listing GPUs
    try {
      remap = resolveRemap(status, onGpus ? await listDevices() : [], move);
    } catch (err) {
      await (await early)?.close();
      throw err;
    }
  }
  const store = snapshot?.store ?? (source as SnapshotRef).store;
  const name = snapshot?.name ?? (source as SnapshotRef).name;
  return new EngineRestoreRun({ started, client, control, status, snapshot, openError, name, store, options, hooks, plan, remap, early });
}

/**
 * Brings the engine to a sleeping state the restore can fill: a deep-suspended engine's ranks
 * restored (onto their new GPUs with a move, after a check that each has room for the process and
 * its weights: a move the driver refuses for memory may leave the process unrestorable, see
 * gpu-remap.ts) and unlocked; an awake engine refused, unless the caller swaps models in place (it
 * is put to sleep first).
 * @internal
 */
export async function prepareEngine(run: EngineRestoreRun): Promise<void> {
  const remap = run.remap;
  const weights: number[] = [];
  for (const r of run.status.ranks) weights[r.rank] = Math.max(r.bytes, run.snapshot?.manifest.data.ranks.find((m) => m.rank === r.rank)?.regions.reduce((n, x) => n + x.size, 0) ?? 0);
  const roomCheck = remap ? async () => describeRoom(checkRoom(remap, await listDevices({ freeMemory: true }), weights, run.options.move?.reserveBytes)) : undefined;
  const opened = (performance.now() - run.started) / 1000;
  // A checkpointed process needs its GPU memory back: memory made here early goes first.
  const deep = await resumeIfDeep(run.status, run.hooks.checkpoint, remap?.pairs, roomCheck, () => run.dropEarly());
  if (deep) {
    run.phases.open = opened; // the snapshot opened and the engine read, before its processes were restored
    for (const [step, seconds] of Object.entries(deep)) run.phases[`deep.${step}` as 'deep.restore'] = seconds;
    run.lap.restart();
    run.status = await run.control.status(run.call);
  }
  if (!run.status.sleeping) {
    if (!run.options.allowModelSwap) {
      throw new VsnapError('E_ENGINE_STATE', 'the engine is awake: restoring would overwrite a working model. Suspend it first, or pass allowModelSwap to swap models in place.');
    }
    await run.control.sleep(2, undefined, run.call);
    run.lap('sleep');
    run.status = await run.control.status(run.call);
  }
  run.lap('prepare'); // the engine's status, the snapshot opened, the driver asked whether a rank is checkpointed
}
