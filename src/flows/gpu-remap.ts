import { VsnapError } from '../errors.js';
import type { EngineStatus } from '../engine/engine-client.js';
import type { ExportedRegions } from '../engine/export.js';
import type { GpuDevice } from '../gpu/cuda.js';
import type { NativeGpuPair } from '../native/index.js';

/*
 * Restore onto another GPU: the driver's process restore takes GPU pairs (old UUID -> new UUID,
 * CUcheckpointRestoreArgs.gpuPairs, driver r580+). cuda.h: the list "must contain every
 * checkpointed GPU" and each new GPU must be of the same chip and have the memory. In practice the
 * driver refuses a lone pair 0->1 on a machine of several GPUs (CUDA_ERROR_INVALID_VALUE; the
 * cuda-checkpoint tool's --device-map, NVIDIA/cuda-checkpoint issue 35) and accepts a whole
 * permutation of the GPUs (0->1 with 1->0, and every other GPU onto itself: CRIU's
 * --gpu-device-map example, checkpoint-restore/criu PR 2836). So the pairs here always name
 * every GPU this process sees, as a permutation: the moves asked for, the GPUs they displace
 * sent to the ones they vacate, and every other GPU onto itself. Every rank of an engine gets the
 * same pairs (one map of the machine's GPUs).
 */

/**
 * A GPU: its ordinal in this process (after CUDA_VISIBLE_DEVICES) or its UUID ("GPU-…", as
 * `nvidia-smi -L` and `listDevices` of vsnap/plumbing print it).
 * @public
 */
export type GpuRef = number | string;

/** A resolved remap: the driver's pairs, and where each rank's GPU goes (by UUID). @internal */
export interface GpuRemap {
  /** Every GPU this process sees, as a permutation (the driver's restore pairs). */
  readonly pairs: NativeGpuPair[];
  /** The moves asked for, old UUID -> new UUID (identity moves left out). */
  readonly moves: ReadonlyMap<string, string>;
  /** The GPU (UUID) each rank is on after the restore, indexed by rank. */
  readonly rankTargets: string[];
  /** What each rank's process restore needs there, indexed by rank (processReserve of the status). */
  readonly processBytes?: readonly number[];
}

const invalid = (message: string, details: Record<string, unknown> = {}): never => {
  throw new VsnapError('E_INVALID_ARGUMENT', message, details);
};

const describeGpu = (d: GpuDevice): string => `${d.ordinal} (${d.name}, ${d.uuid})`;

/** The device a GpuRef names among `devices`, or E_INVALID_ARGUMENT listing them. @internal */
export function findGpu(ref: GpuRef, devices: readonly GpuDevice[], what: string): GpuDevice {
  const found =
    typeof ref === 'number' || /^\d+$/.test(ref)
      ? devices.find((d) => d.ordinal === Number(ref))
      : devices.find((d) => d.uuid.toLowerCase() === ref.toLowerCase());
  if (!found) {
    invalid(`${what} ${JSON.stringify(ref)} is not a GPU this process sees; it sees ${devices.map(describeGpu).join(', ') || 'none'}. Name a GPU by its ordinal here or its UUID.`, {
      gpu: ref,
      visible: devices.map((d) => d.uuid),
    });
  }
  return found!;
}

/**
 * Completes the moves asked for (old UUID -> new UUID) into a permutation of `all` (every GPU
 * UUID this process sees, in ordinal order): each GPU a move vacates takes one a move displaced
 * (in ordinal order), every other GPU maps onto itself. Throws E_INVALID_ARGUMENT for two moves
 * onto one GPU or a GPU not in `all`.
 * @internal
 */
export function permutationPairs(moves: ReadonlyMap<string, string>, all: readonly string[]): NativeGpuPair[] {
  const known = new Set(all);
  const targets = new Set<string>();
  for (const [from, to] of moves) {
    if (!known.has(from) || !known.has(to)) invalid(`GPU map ${from} -> ${to} names a GPU this process does not see`, { from, to });
    if (targets.has(to)) invalid(`GPU map sends two GPUs onto ${to}: the driver restores onto a permutation of the GPUs`, { to });
    targets.add(to);
  }
  const vacated = all.filter((u) => !targets.has(u) && moves.has(u)); // left, nothing comes in
  const displaced = all.filter((u) => targets.has(u) && !moves.has(u)); // taken, its own GPU must go somewhere
  const map = new Map<string, string>(moves);
  displaced.forEach((u, i) => map.set(u, vacated[i]!));
  for (const u of all) if (!map.has(u)) map.set(u, u);
  return all.map((u) => ({ oldUuid: u, newUuid: map.get(u)! }));
}

/**
 * Resolves `onto` (a single-GPU engine's new GPU) or `gpuMap` (old GPU -> new GPU) for an
 * engine into the driver's pairs. Refuses (E_INVALID_ARGUMENT, before anything changes) a GPU
 * this process does not see, a host-memory engine, and a new GPU of another kind than the old
 * one (name or compute capability differ: the driver restores only onto the same chip). Returns
 * undefined when every GPU stays where it is.
 * @internal
 */
export function resolveRemap(
  status: EngineStatus,
  devices: readonly GpuDevice[],
  options: { onto?: GpuRef; gpuMap?: Readonly<Record<string, GpuRef>> },
): GpuRemap | undefined {
  if (options.onto !== undefined && options.gpuMap !== undefined) invalid('give either onto or gpuMap, not both');
  if (status.ranks.some((r) => r.memory !== 'cuda')) invalid('the engine keeps its weights in host memory: it has no GPU to move');
  const engineGpus = [...new Set(status.ranks.map((r) => r.device.uuid))].map((u) => findGpu(u, devices, "the engine's GPU"));
  const moves = new Map<string, string>();
  if (options.onto !== undefined) {
    if (engineGpus.length !== 1) {
      invalid(`onto moves an engine on one GPU; this one runs on ${engineGpus.length} (${engineGpus.map(describeGpu).join(', ')}): give gpuMap instead`, {
        gpus: engineGpus.map((g) => g.uuid),
      });
    }
    moves.set(engineGpus[0]!.uuid, findGpu(options.onto, devices, 'onto').uuid);
  } else {
    for (const [from, to] of Object.entries(options.gpuMap ?? {})) {
      const old = findGpu(from, devices, 'gpuMap key');
      const target = findGpu(to, devices, `gpuMap[${JSON.stringify(from)}]`);
      if (moves.has(old.uuid)) invalid(`gpuMap names GPU ${describeGpu(old)} twice`);
      moves.set(old.uuid, target.uuid);
    }
  }
  const seen = new Set<string>();
  for (const to of moves.values()) {
    if (seen.has(to)) invalid(`the GPU map sends two GPUs onto ${to}: the driver restores onto a permutation of the GPUs`, { to });
    seen.add(to);
  }
  for (const [from, to] of moves) {
    const a = devices.find((d) => d.uuid === from)!;
    const b = devices.find((d) => d.uuid === to)!;
    if (a.name !== b.name || a.computeCapability !== b.computeCapability) {
      invalid(
        `GPU ${describeGpu(b)} is not of the same kind as ${describeGpu(a)} (compute capability ${b.computeCapability} vs ${a.computeCapability}): ` +
          'the driver restores a process only onto the same chip. Pick a GPU of the same kind.',
        { from, to, fromName: a.name, toName: b.name },
      );
    }
    if (from === to) moves.delete(from);
  }
  if (moves.size === 0) return undefined;
  const all = [...devices].sort((x, y) => x.ordinal - y.ordinal).map((d) => d.uuid);
  const pairs = permutationPairs(moves, all);
  const after = new Map(pairs.map((p) => [p.oldUuid, p.newUuid]));
  const rankTargets: string[] = [];
  for (const r of status.ranks) rankTargets[r.rank] = after.get(findGpu(r.device.uuid, devices, "the engine's GPU").uuid)!;
  return { pairs, moves, rankTargets, processBytes: processReserve(status) };
}

/*
 * Room on the new GPUs, checked before the driver is called: on driver 580 a restore with pairs
 * that the driver refuses for lack of memory (CUDA_ERROR_OUT_OF_MEMORY) left the process
 * unrestorable, even in place (a following plain restore failed CUDA_ERROR_OPERATING_SYSTEM;
 * test/gpu/remap.gpu.test.ts prints it). So a move is refused up front unless each new GPU has
 * room for what the process restore recreates there and for the weights the wake allocates
 * right after (a move that fits the process but not its weights would leave it moved and unable
 * to wake). The process part: what the plugin measured before the checkpoint (`processBytes` per
 * rank in its status, NVML's reading of the worker's pid, kept while the process is checkpointed
 * and unlisted), else an estimate: after a level-2 sleep what stays resident is the CUDA context,
 * the CUDA-graph pool and leftovers (about 0.7 GiB measured on an H200 for the reference engine,
 * 1-3 GiB for vLLM).
 */

/** The GPU memory a deep-suspended worker's process restore is assumed to need, per rank, unless `reserveBytes` says otherwise. @internal */
export const DEFAULT_PROCESS_RESERVE_BYTES = 2 * 1024 ** 3;

/** What a new GPU must have free for the ranks sent onto it. @internal */
export interface GpuRoom {
  readonly uuid: string;
  readonly ordinal: number;
  readonly ranks: number[];
  /** The process estimate plus the weights of every rank sent there, in bytes. */
  readonly needed: number;
  /** Free memory measured there (null: the driver did not say). */
  readonly free: number | null;
}

const mib = (n: number): string => `${(n / 1024 ** 2).toFixed(0)} MiB`;

/**
 * What each rank's process restore needs on its new GPU, in bytes (indexed by rank): the
 * caller's `reserveBytes` for every rank when given, else what the plugin measured
 * (`processBytes` in the status: NVML's reading of the worker's pid), else the estimate
 * DEFAULT_PROCESS_RESERVE_BYTES. @internal
 */
export function processReserve(status: { readonly ranks: ReadonlyArray<{ readonly rank: number; readonly processBytes?: number | null }> }, reserveBytes?: number): number[] {
  const out: number[] = [];
  for (const r of status.ranks) out[r.rank] = reserveBytes ?? (typeof r.processBytes === 'number' ? r.processBytes : DEFAULT_PROCESS_RESERVE_BYTES);
  return out;
}

/**
 * Checks that every GPU a rank is restored onto has room for the rank's process (the caller's
 * `reserveBytes`: one count for every rank, or one per rank; else the remap's per-rank
 * processBytes, which resolveRemap read from the status; else the estimate) and its weights (`weightsBytes[rank]`), from `devices` read with free memory. Throws
 * E_INVALID_ARGUMENT naming each GPU short of room (details.gpus: needed and free) before
 * anything changes; returns what it measured. A GPU whose free memory is unknown is not refused.
 * @internal
 */
export function checkRoom(remap: GpuRemap, devices: readonly GpuDevice[], weightsBytes: readonly number[], reserveBytes?: number | readonly number[]): GpuRoom[] {
  const processBytes = reserveBytes ?? remap.processBytes ?? DEFAULT_PROCESS_RESERVE_BYTES;
  const perRank = (rank: number): number => (typeof processBytes === 'number' ? processBytes : (processBytes[rank] ?? DEFAULT_PROCESS_RESERVE_BYTES));
  for (const n of typeof processBytes === 'number' ? [processBytes] : processBytes) {
    if (!Number.isSafeInteger(n) || n < 0) invalid(`move.reserveBytes must be a byte count (a non-negative integer), got ${String(n)}`, { reserveBytes: n });
  }
  const byGpu = new Map<string, number[]>();
  remap.rankTargets.forEach((uuid, rank) => byGpu.set(uuid, [...(byGpu.get(uuid) ?? []), rank]));
  const rooms = [...byGpu].map(([uuid, ranks]): GpuRoom => {
    const d = findGpu(uuid, devices, 'the new GPU');
    const needed = ranks.reduce((sum, r) => sum + perRank(r) + (weightsBytes[r] ?? 0), 0);
    return { uuid, ordinal: d.ordinal, ranks, needed, free: d.freeMemory };
  });
  const short = rooms.filter((r) => r.free !== null && r.free < r.needed);
  if (short.length) {
    const process = typeof processBytes === 'number' ? `${mib(processBytes)} per rank` : short.flatMap((r) => r.ranks.map((k) => `${mib(perRank(k))} for rank ${k}`)).join(', ');
    invalid(
      `not enough free memory on ${short.map((r) => `GPU ${r.ordinal} (${r.uuid}): ${mib(r.free!)} free, ${mib(r.needed)} needed for rank(s) ${r.ranks.join(', ')}`).join('; ')}. ` +
        `Needed: ${process} for the process restore (move.reserveBytes, else what the plugin measured, else an estimate) plus the rank's weights. Nothing was changed: the engine is still ` +
        'deep-suspended on its own GPU(s). Free memory there, pick another GPU, or restore it without onto/gpuMap.',
      { reason: 'memory', gpus: short.map((r) => ({ ...r })), processBytes },
    );
  }
  return rooms;
}

/** One line of what checkRoom measured, for an error message. @internal */
export function describeRoom(rooms: readonly GpuRoom[]): string {
  return rooms.map((r) => `GPU ${r.ordinal}: ${r.free === null ? 'free memory unknown' : `${mib(r.free)} free`}, ${mib(r.needed)} estimated`).join('; ');
}

/**
 * After a restore onto other GPUs: every rank's export must report the GPU it was sent to (the
 * plugin reads the UUID afresh at each export). The weights' memory is new there, at the same
 * addresses; a rank still on its old GPU (or elsewhere) means the move did not happen as asked.
 * @internal
 */
export function checkMoved(exported: ExportedRegions, remap: GpuRemap): void {
  const wrong = exported.ranks.filter((r) => r.deviceUuid !== remap.rankTargets[r.rank]);
  if (wrong.length === 0) return;
  throw new VsnapError(
    'E_ENGINE_STATE',
    `after the restore onto other GPUs, ${wrong.map((r) => `rank ${r.rank} reports GPU ${r.deviceUuid}, not ${remap.rankTargets[r.rank]}`).join('; ')}. ` +
      'Is the vsnap plugin current (it re-reads its GPU at each export)? Check the engine with nvidia-smi before sending it requests.',
    { ranks: wrong.map((r) => r.rank), reported: wrong.map((r) => r.deviceUuid), expected: wrong.map((r) => remap.rankTargets[r.rank]) },
  );
}
