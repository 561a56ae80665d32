import { toVsnapError, VsnapError } from '../errors.js';
import type { EngineStatus } from '../engine/engine-client.js';
import { openExports } from '../engine/export.js';
import { native, type NativeGpuPair, type NativeProcessState } from '../native/index.js';
import { phaseTimer } from './checks.js';

/*
 * Deep suspend: after a level-2 sleep, the driver's process checkpoint API moves what the engine's
 * workers still hold on the GPU (CUDA context, CUDA-graph pool, NCCL buffers) into host RAM, so
 * the engine holds 0 bytes of GPU memory. Every rank is locked before any is checkpointed, and
 * every rank is restored before any is unlocked (as vLLM's experimental ProcessCheckpointExecutor
 * does for level 1: vllm/v1/executor/process_checkpoint_executor.py), so no rank runs while
 * another is gone. The state lives in the driver, so a new SDK process finds it by pid.
 */

/**
 * The driver's process checkpoint calls, by pid: the native addon's by default, a fake in tests.
 * @internal
 */
export interface CheckpointBackend {
  state(pid: number): Promise<NativeProcessState>;
  lock(pid: number, timeoutMs: number): Promise<void>;
  checkpoint(pid: number): Promise<void>;
  /** With pairs: onto other GPUs (see gpu-remap.ts). */
  restore(pid: number, pairs?: readonly NativeGpuPair[]): Promise<void>;
  unlock(pid: number): Promise<void>;
}

/** @internal */
export function nativeCheckpointBackend(): CheckpointBackend {
  const b = native();
  // The addon rejects with plain Errors carrying code and details: make them VsnapErrors.
  const call = <T>(p: () => Promise<T>): Promise<T> =>
    p().catch((err: unknown) => {
      throw toVsnapError(err);
    });
  return {
    state: (pid) => call(() => b.checkpointState(pid)),
    lock: (pid, timeoutMs) => call(() => b.checkpointLock(pid, timeoutMs)),
    checkpoint: (pid) => call(() => b.checkpointCheckpoint(pid)),
    restore: (pid, pairs) => call(() => (pairs?.length ? b.checkpointRestore(pid, pairs) : b.checkpointRestore(pid))),
    unlock: (pid) => call(() => b.checkpointUnlock(pid)),
  };
}

/** One worker process of an engine. @internal */
export interface DeepRank {
  readonly rank: number;
  readonly pid: number;
}

/** Seconds each deep step took. @internal */
export interface DeepTimes {
  [step: string]: number;
}

/** The default lock timeout: a worker mid-kernel gets this long to reach a lockable point. */
export const DEFAULT_LOCK_TIMEOUT_MS = 10_000;

/** The worker processes of an engine, from the plugin's status (each rank reports its pid). @internal */
export function engineRanks(status: EngineStatus): DeepRank[] {
  if (status.ranks.length === 0) {
    throw new VsnapError('E_ENGINE_STATE', 'deep suspend needs the pid of every worker, and the engine reports no ranks: load the vsnap plugin (VLLM_PLUGINS=vsnap)');
  }
  return status.ranks.map((r) => ({ rank: r.rank, pid: r.pid }));
}

type Outcome = { rank: DeepRank; error?: VsnapError };

/** Runs step on every rank at once and reports each outcome (never throws). */
async function each(ranks: readonly DeepRank[], step: (pid: number) => Promise<unknown>): Promise<Outcome[]> {
  const settled = await Promise.allSettled(ranks.map((r) => step(r.pid)));
  return settled.map((s, i) => (s.status === 'fulfilled' ? { rank: ranks[i]! } : { rank: ranks[i]!, error: toVsnapError(s.reason) }));
}

const describe = (o: Outcome): string => `rank ${o.rank.rank} (pid ${o.rank.pid}): ${o.error!.message}`;
/** Without the native advice (whose "it stays checkpointed" a remap refused for memory belies). */
const describeBare = (o: Outcome): string =>
  `rank ${o.rank.rank} (pid ${o.rank.pid}): ${String(o.error!.details.call ?? 'the restore')} failed with ${String(o.error!.details.cudaError ?? o.error!.code)}`;

/** The driver's state of every rank, in rank order. Throws E_CHECKPOINT_UNSUPPORTED without the API. @internal */
export async function processStates(ranks: readonly DeepRank[], backend: CheckpointBackend): Promise<NativeProcessState[]> {
  return Promise.all(ranks.map((r) => backend.state(r.pid)));
}

/**
 * Puts every rank back to running from wherever a failed step left it: restores what is
 * checkpointed, then unlocks what is locked. Returns what could not be undone (empty: nothing is
 * stranded).
 */
async function rollback(ranks: readonly DeepRank[], backend: CheckpointBackend): Promise<string[]> {
  const left: string[] = [];
  const states = await each(ranks, async (pid) => {
    const state = await backend.state(pid);
    if (state === 'checkpointed') await backend.restore(pid);
    if (state === 'checkpointed' || state === 'locked') await backend.unlock(pid);
  });
  for (const o of states) if (o.error) left.push(describe(o));
  return left;
}

/**
 * Locks every rank, then (only when all are locked) checkpoints every rank. On any failure every
 * rank is put back to running (the engine stays asleep at level 2, usable) and the error says
 * which rank failed and why; `details.stranded` lists what could not be undone.
 * @internal
 */
export async function deepSuspendRanks(ranks: readonly DeepRank[], backend: CheckpointBackend, lockTimeoutMs = DEFAULT_LOCK_TIMEOUT_MS): Promise<DeepTimes> {
  const times: DeepTimes = {};
  const lap = phaseTimer(times);
  refuseOpenExports(ranks);
  // Before anything changes: the API is there (else E_CHECKPOINT_UNSUPPORTED), every rank runs.
  const states = await processStates(ranks, backend);
  const notRunning = ranks.filter((_, i) => states[i] !== 'running');
  if (notRunning.length === ranks.length && states.every((s) => s === 'checkpointed')) return times; // already deep
  if (notRunning.length) {
    throw new VsnapError(
      'E_CHECKPOINT',
      `deep suspend needs every worker running, and ${notRunning.map((r) => `rank ${r.rank} (pid ${r.pid}) is ${states[ranks.indexOf(r)]}`).join(', ')}. ` +
        'Restore the engine first (restoreEngine restores and unlocks every rank), then suspend again.',
      { reason: 'state', ranks: notRunning.map((r) => r.rank), states },
    );
  }
  lap('checkState');
  const failed = async (step: string, outcomes: Outcome[]): Promise<never> => {
    const bad = outcomes.filter((o) => o.error);
    const stranded = await rollback(ranks, backend);
    const first = bad[0]!.error!;
    throw new VsnapError(
      first.code,
      `deep suspend failed at ${step}: ${bad.map(describe).join('; ')}\n` +
        (stranded.length
          ? `and these ranks could not be put back to running: ${stranded.join('; ')}. Restart the engine; its snapshot brings the weights back.`
          : 'Every rank was put back to running: the engine is asleep (level 2) and restores as usual.'),
      { ...first.details, step, ranks: bad.map((o) => o.rank.rank), stranded },
      { cause: first },
    );
  };
  const locked = await each(ranks, (pid) => backend.lock(pid, lockTimeoutMs));
  if (locked.some((o) => o.error)) await failed('lock', locked);
  lap('lock');
  const checkpointed = await each(ranks, (pid) => backend.checkpoint(pid));
  if (checkpointed.some((o) => o.error)) await failed('checkpoint', checkpointed);
  lap('checkpoint');
  return times;
}

/**
 * Brings every rank of a deep-suspended engine back: restores each checkpointed rank, then (only
 * when all are restored) unlocks every rank. Returns undefined when the driver reports no rank
 * locked or checkpointed (or has no checkpoint API, so none can be). With `pairs` (gpu-remap.ts)
 * every rank is restored onto its new GPU; then an engine that is not checkpointed, or a driver
 * without the API, is an error rather than nothing to do, and `roomCheck` runs once the state is
 * read, before any restore (it throws to refuse the move; what it returns, a line of what it
 * measured, goes into the error should the driver still refuse).
 * @internal
 */
export async function deepRestoreRanks(
  ranks: readonly DeepRank[],
  backend: CheckpointBackend,
  pairs?: readonly NativeGpuPair[],
  roomCheck?: () => Promise<string | undefined>,
  beforeRestore?: () => Promise<void>,
): Promise<DeepTimes | undefined> {
  const times: DeepTimes = {};
  const lap = phaseTimer(times);
  const states: Array<NativeProcessState | undefined> = ranks.map(() => undefined);
  const read = await each(ranks, async (pid) => (states[ranks.findIndex((r) => r.pid === pid)] = await backend.state(pid)));
  const unsupported = read.find((o) => o.error?.code === 'E_CHECKPOINT_UNSUPPORTED');
  if (unsupported && pairs) throw unsupported.error!;
  if (unsupported) return undefined;
  // Deep only where the driver says a rank is locked or checkpointed: pids this process cannot
  // read (another PID namespace, another user) never make a plain restore fail.
  if (pairs && !states.some((s) => s === 'checkpointed')) {
    throw new VsnapError(
      'E_ENGINE_STATE',
      `only a deep-suspended engine moves to another GPU, and no worker of this one is checkpointed (${ranks.map((r, i) => `rank ${r.rank}: ${states[i] ?? 'unreadable'}`).join(', ')}). ` +
        'Suspend it with deep first, or restore it without a GPU map.',
      { reason: 'state', states },
    );
  }
  if (!states.some((s) => s === 'locked' || s === 'checkpointed')) return undefined;
  const unreadable = read.filter((o) => o.error && o.error.details.reason !== 'gone');
  if (unreadable.length) {
    const first = unreadable[0]!.error!;
    throw new VsnapError(first.code, `could not read the checkpoint state of the engine's workers (nothing was changed): ${unreadable.map(describe).join('; ')}`, { ...first.details, step: 'state' }, { cause: first });
  }
  const gone = read.filter((o) => o.error);
  await beforeRestore?.();
  const measured = pairs && roomCheck && !gone.length ? await roomCheck() : undefined;
  const survivors = ranks.filter((_, i) => !read[i]!.error);
  const restored = await each(
    survivors.filter((r) => states[ranks.indexOf(r)] === 'checkpointed'),
    (pid) => (pairs ? backend.restore(pid, pairs) : backend.restore(pid)),
  );
  lap('restore');
  const failedRestore = restored.filter((o) => o.error);
  if (gone.length) {
    // A worker exited while suspended: the engine cannot serve. Let the others run, so they can exit cleanly.
    await each(survivors, async (pid) => ((await backend.state(pid)) === 'locked' ? backend.unlock(pid) : undefined));
    const first = gone[0]!.error!;
    throw new VsnapError(
      'E_CHECKPOINT',
      `the engine cannot be restored: ${gone.map(describe).join('; ')}. A worker process of a deep-suspended engine is gone; ` +
        'restart the engine (its snapshot brings the weights back).',
      { ...first.details, reason: 'gone', ranks: gone.map((o) => o.rank.rank) },
      { cause: first },
    );
  }
  if (failedRestore.length && pairs) throw remapRestoreError(ranks, restored, pairs, measured);
  if (failedRestore.length) {
    const first = failedRestore[0]!.error!;
    throw new VsnapError(
      first.code,
      `restoring the deep-suspended engine failed: ${failedRestore.map(describe).join('; ')}. ` +
        'The ranks that did restore stay locked, so nothing runs half-restored. Retry the restore (it restores what is still ' +
        "checkpointed, then unlocks every rank); if a rank's state is 'failed' or its process is gone, restart the engine: its snapshot brings the weights back.",
      { ...first.details, step: 'restore', ranks: failedRestore.map((o) => o.rank.rank) },
      { cause: first },
    );
  }
  const unlocked = await each(ranks, (pid) => backend.unlock(pid));
  lap('unlock');
  const failedUnlock = unlocked.filter((o) => o.error);
  if (failedUnlock.length) {
    const first = failedUnlock[0]!.error!;
    throw new VsnapError(
      first.code,
      `unlocking the restored engine failed: ${failedUnlock.map(describe).join('; ')}. Retry the restore; if it fails again, restart the engine.`,
      { ...first.details, step: 'unlock', ranks: failedUnlock.map((o) => o.rank.rank) },
      { cause: first },
    );
  }
  return times;
}

/**
 * Deep-restores the engine if the driver says its workers are locked or checkpointed (a deep
 * suspend by this or another SDK process); undefined when they all run. Host-memory engines
 * have nothing on a GPU and are left alone.
 * @internal
 */
export async function resumeIfDeep(
  status: EngineStatus,
  backend?: CheckpointBackend,
  pairs?: readonly NativeGpuPair[],
  roomCheck?: () => Promise<string | undefined>,
  beforeRestore?: () => Promise<void>,
): Promise<DeepTimes | undefined> {
  if (!backend && !pairs && !status.ranks.some((r) => r.memory === 'cuda')) return undefined;
  if (status.ranks.length === 0) return undefined;
  return deepRestoreRanks(engineRanks(status), backend ?? nativeCheckpointBackend(), pairs, roomCheck, beforeRestore);
}

/** Checks, before anything changes, that every worker can be deep-suspended (the API is there, each runs). @internal */
export async function deepPrecheck(status: EngineStatus, backend: CheckpointBackend): Promise<DeepRank[]> {
  const ranks = engineRanks(status);
  await processStates(ranks, backend);
  return ranks;
}

/**
 * Refuses to deep-suspend while this process still holds descriptors the engine's workers
 * exported (an export not closed): the checkpoint would have to leave memory behind that another
 * process can reach. The SDK's own flows close every export before they sleep the engine.
 */
function refuseOpenExports(ranks: readonly DeepRank[]): void {
  const open = ranks.map((r) => ({ rank: r, fds: openExports(r.pid) })).filter((x) => x.fds > 0);
  if (open.length === 0) return;
  throw new VsnapError(
    'E_ENGINE_STATE',
    `deep suspend refused: this process still holds ${open.map((x) => `${x.fds} exported descriptor(s) of rank ${x.rank.rank} (pid ${x.rank.pid})`).join(', ')}. ` +
      "Close the export (ExportedRegions.close) before the engine's processes are checkpointed; nothing was changed.",
    { reason: 'handles', ranks: open.map((x) => x.rank.rank), fds: open.map((x) => x.fds) },
  );
}

/**
 * A restore onto other GPUs that failed for some rank: says which, with the pairs, what the
 * driver said, and what to do. Ranks that did restore stay locked on their new GPUs (nothing of
 * the engine runs half-moved); retrying the same restore (same GPU map) finishes the move. A
 * refusal other than for memory leaves the failed ranks checkpointed on their own GPUs. One for
 * memory (after the SDK's room check passed) may not: on driver 580 the process could not be
 * restored afterwards, even in place (CUDA_ERROR_OPERATING_SYSTEM), so the message says so.
 */
function remapRestoreError(ranks: readonly DeepRank[], restored: Outcome[], pairs: readonly NativeGpuPair[], measured?: string): VsnapError {
  const failed = restored.filter((o) => o.error);
  const locked = restored.filter((o) => !o.error).map((o) => o.rank.rank);
  const first = failed[0]!.error!;
  const shown = pairs.map((p) => `${p.oldUuid} -> ${p.newUuid}`).join(', ');
  const memory = first.code !== 'E_CHECKPOINT_UNSUPPORTED' && first.details.reason === 'memory';
  const hint =
    first.code === 'E_CHECKPOINT_UNSUPPORTED'
      ? 'This driver cannot restore a process onto other GPUs (GPU pairs need r580 or newer): upgrade it, or restore without a GPU map.'
      : memory
        ? `A new GPU lacks the memory the process had, although the SDK's check before the restore found room (${measured ?? 'not measured'}; the process part is an estimate: raise move.reserveBytes). ` +
          'The failed rank(s) may not be restorable any more, even in place: on driver 580 a following restore failed with CUDA_ERROR_OPERATING_SYSTEM. ' +
          "Try restoreEngine without onto/gpuMap once; if it fails, kill the engine's processes, start the engine again and restore it from its snapshot."
        : "The driver wants every GPU the process was checkpointed with, as a permutation onto GPUs of the same chip; check the map, or restore without one.";
  const where = memory
    ? ''
    : locked.length
      ? ''
      : ranks.length > 1
        ? ' No rank was restored: the engine is still deep-suspended on its own GPUs.'
        : ' The engine is still deep-suspended on its own GPU.';
  return new VsnapError(
    first.code,
    `restoring the deep-suspended engine onto other GPUs failed: ${failed.map(memory ? describeBare : describe).join('; ')} (GPU pairs: ${shown}). ${hint}` +
      (locked.length ? ` Rank(s) ${locked.join(', ')} did restore and stay locked on their new GPUs: retry with the same GPU map to finish the move.` : where),
    { ...first.details, step: 'restore', ranks: failed.map((o) => o.rank.rank), locked, pairs: pairs.map((p) => ({ ...p })), ...(measured ? { measured } : {}) },
    { cause: first },
  );
}
