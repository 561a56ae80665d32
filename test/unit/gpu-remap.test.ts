import { describe, expect, it } from 'vitest';

import type { EngineStatus } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';
import type { GpuDevice } from '../../src/gpu/cuda.js';
import { native } from '../../src/native/index.js';
import { deepRestoreRanks, deepSuspendRanks, nativeCheckpointBackend } from '../../src/flows/deep.js';
import { checkRoom, DEFAULT_PROCESS_RESERVE_BYTES, describeRoom, permutationPairs, processReserve, resolveRemap } from '../../src/flows/gpu-remap.js';
import { FakeCheckpointDriver } from '../helpers/fake-checkpoint.js';
import { rejection } from '../helpers/rejection.js';

const uuid = (i: number): string => `GPU-0000000${i}-0000-0000-0000-000000000000`;
const gpu = (i: number, name = 'NVIDIA H200', cc = '9.0'): GpuDevice => ({
  ordinal: i,
  name,
  uuid: uuid(i),
  pciBusId: `0000:0${i}:00.0`,
  computeCapability: cc,
  totalMemory: 150e9,
  freeMemory: null,
  vmmGranularity: 2 << 20,
  vmmSupported: true,
  posixFdHandlesSupported: true,
});
const machine = (n: number): GpuDevice[] => Array.from({ length: n }, (_, i) => gpu(i));

/** An engine status with one rank per entry of `gpus` (device ordinals). */
function engineOn(gpus: number[], memory: 'cuda' | 'host' = 'cuda'): EngineStatus {
  return { ranks: gpus.map((g, rank) => ({ rank, pid: 1000 + rank, memory, device: { ordinal: g, uuid: memory === 'cuda' ? uuid(g) : `HOST-${g}` } })) } as unknown as EngineStatus;
}

function rejectsWith(fn: () => unknown, code: string, message?: RegExp): VsnapError {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(VsnapError);
  expect((err as VsnapError).code).toBe(code);
  if (message) expect((err as VsnapError).message).toMatch(message);
  return err as VsnapError;
}

const asMap = (pairs: Array<{ oldUuid: string; newUuid: string }>): Record<string, string> => Object.fromEntries(pairs.map((p) => [p.oldUuid.slice(4, 12), p.newUuid.slice(4, 12)]));

describe('GPU pairs: a whole permutation of the GPUs', () => {
  it('two GPUs: 0->1 also sends 1->0 (the driver refuses a lone pair)', () => {
    expect(permutationPairs(new Map([[uuid(0), uuid(1)]]), [uuid(0), uuid(1)])).toEqual([
      { oldUuid: uuid(0), newUuid: uuid(1) },
      { oldUuid: uuid(1), newUuid: uuid(0) },
    ]);
  });

  it('four GPUs: displaced GPUs take the vacated ones, the others stay', () => {
    const all = [0, 1, 2, 3].map(uuid);
    expect(asMap(permutationPairs(new Map([[uuid(0), uuid(2)]]), all))).toEqual({ '00000000': '00000002', '00000001': '00000001', '00000002': '00000000', '00000003': '00000003' });
    // a chain 0->1, 1->2 closes with 2->0
    expect(asMap(permutationPairs(new Map([[uuid(0), uuid(1)], [uuid(1), uuid(2)]]), all))).toEqual({ '00000000': '00000001', '00000001': '00000002', '00000002': '00000000', '00000003': '00000003' });
  });

  it('for any number of GPUs and any moves: a permutation of every GPU that keeps every move', () => {
    let seed = 7;
    const rand = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    for (let n = 1; n <= 16; n++) {
      for (let trial = 0; trial < 20; trial++) {
        const all = Array.from({ length: n }, (_, i) => uuid(i));
        const targets = [...all].sort(() => rand(3) - 1);
        const moves = new Map<string, string>();
        for (const [i, from] of all.entries()) if (rand(2)) moves.set(from, targets[i]!);
        const pairs = permutationPairs(moves, all);
        expect(pairs.map((p) => p.oldUuid)).toEqual(all);
        expect(new Set(pairs.map((p) => p.newUuid)).size).toBe(n);
        for (const [from, to] of moves) expect(pairs.find((p) => p.oldUuid === from)!.newUuid).toBe(to);
      }
    }
  });

  it('refuses two GPUs onto one, and a GPU it does not see', () => {
    const all = [0, 1, 2].map(uuid);
    rejectsWith(() => permutationPairs(new Map([[uuid(0), uuid(2)], [uuid(1), uuid(2)]]), all), 'E_INVALID_ARGUMENT', /two GPUs onto/);
    rejectsWith(() => permutationPairs(new Map([[uuid(0), uuid(5)]]), all), 'E_INVALID_ARGUMENT', /does not see/);
  });
});

describe('resolveRemap: what the caller asks, checked before anything changes', () => {
  it('onto by ordinal, by "ordinal" and by UUID; the rank lands on the target', () => {
    for (const onto of [1, '1', uuid(1), uuid(1).toUpperCase()]) {
      const r = resolveRemap(engineOn([0]), machine(2), { onto })!;
      expect(r.rankTargets).toEqual([uuid(1)]);
      expect(r.pairs).toHaveLength(2);
    }
  });

  it('onto its own GPU is no remap', () => {
    expect(resolveRemap(engineOn([1]), machine(2), { onto: 1 })).toBeUndefined();
  });

  it('a tensor-parallel engine on GPUs 0,1 moved onto 2,3 of four: every rank the same pairs, each its target', () => {
    const r = resolveRemap(engineOn([0, 1]), machine(4), { gpuMap: { 0: 2, [uuid(1)]: 3 } })!;
    expect(r.rankTargets).toEqual([uuid(2), uuid(3)]);
    expect(asMap(r.pairs)).toEqual({ '00000000': '00000002', '00000001': '00000003', '00000002': '00000000', '00000003': '00000001' });
  });

  it('refuses a GPU of another kind, naming both', () => {
    const devices = [gpu(0), gpu(1, 'NVIDIA H100 80GB HBM3', '9.0'), gpu(2, 'NVIDIA H200', '8.0')];
    rejectsWith(() => resolveRemap(engineOn([0]), devices, { onto: 1 }), 'E_INVALID_ARGUMENT', /same kind/);
    rejectsWith(() => resolveRemap(engineOn([0]), devices, { onto: 2 }), 'E_INVALID_ARGUMENT', /compute capability 8\.0 vs 9\.0/);
  });

  it('refuses an invisible GPU, onto for a multi-GPU engine, both options, two GPUs onto one, and a host-memory engine', () => {
    rejectsWith(() => resolveRemap(engineOn([0]), machine(2), { onto: 7 }), 'E_INVALID_ARGUMENT', /not a GPU this process sees/);
    rejectsWith(() => resolveRemap(engineOn([0]), machine(2), { onto: 'GPU-nope' }), 'E_INVALID_ARGUMENT', /not a GPU this process sees/);
    rejectsWith(() => resolveRemap(engineOn([0, 1]), machine(2), { onto: 1 }), 'E_INVALID_ARGUMENT', /give gpuMap/);
    rejectsWith(() => resolveRemap(engineOn([0]), machine(2), { onto: 1, gpuMap: {} }), 'E_INVALID_ARGUMENT', /either onto or gpuMap/);
    rejectsWith(() => resolveRemap(engineOn([0, 1]), machine(3), { gpuMap: { 0: 2, 1: 2 } }), 'E_INVALID_ARGUMENT', /two GPUs onto/);
    rejectsWith(() => resolveRemap(engineOn([0], 'host'), machine(2), { onto: 1 }), 'E_INVALID_ARGUMENT', /host memory/);
  });
});

describe('deep restore onto other GPUs (fake driver that wants a whole permutation)', () => {
  const RANKS = [
    { rank: 0, pid: 1000 },
    { rank: 1, pid: 1001 },
  ];
  const driverOn = (gpus: number[], machineSize: number): FakeCheckpointDriver => {
    const d = new FakeCheckpointDriver(gpus.map((_, i) => 1000 + i));
    d.gpus = Array.from({ length: machineSize }, (_, i) => uuid(i));
    gpus.forEach((g, i) => d.gpuOf.set(1000 + i, uuid(g)));
    return d;
  };

  it('restores every rank with the same pairs onto its new GPU, then unlocks', async () => {
    const d = driverOn([0, 1], 4);
    await deepSuspendRanks(RANKS, d);
    const remap = resolveRemap(engineOn([0, 1]), machine(4), { gpuMap: { 0: 3, 1: 2 } })!;
    d.calls.length = 0;
    const times = await deepRestoreRanks(RANKS, d, remap.pairs);
    expect(Object.keys(times!)).toEqual(['restore', 'unlock']);
    expect(d.calls.filter((c) => !c.startsWith('state'))).toEqual(['restore:1000', 'restore:1001', 'unlock:1000', 'unlock:1001']);
    expect(d.pairsOf.get(1000)).toEqual(d.pairsOf.get(1001));
    expect([d.gpuOf.get(1000), d.gpuOf.get(1001)]).toEqual([uuid(3), uuid(2)]);
    expect(d.notRunning()).toEqual([]);
  });

  it('a lone pair (not the whole permutation) is refused by the driver: named with the pairs, the engine still deep-suspended, a plain restore brings it back', async () => {
    const d = driverOn([0], 2);
    await deepSuspendRanks([RANKS[0]!], d);
    const err = await rejection(deepRestoreRanks([RANKS[0]!], d, [{ oldUuid: uuid(0), newUuid: uuid(1) }]));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ step: 'restore', ranks: [0], locked: [], cudaError: 'CUDA_ERROR_INVALID_VALUE' });
    expect(err.message).toMatch(/GPU pairs: GPU-00000000.* -> GPU-00000001/);
    expect(err.message).toMatch(/permutation/);
    expect(err.message).toMatch(/still deep-suspended on its own GPU/);
    expect(d.states.get(1000)).toBe('checkpointed');
    await deepRestoreRanks([RANKS[0]!], d);
    expect(d.notRunning()).toEqual([]);
    expect(d.gpuOf.get(1000)).toBe(uuid(0));
  });

  it('a driver without GPU pairs: E_CHECKPOINT_UNSUPPORTED saying to upgrade or restore without a map; nothing changed', async () => {
    const d = driverOn([0], 2);
    d.remapSupported = false;
    await deepSuspendRanks([RANKS[0]!], d);
    const pairs = resolveRemap(engineOn([0]), machine(2), { onto: 1 })!.pairs;
    const err = await rejection(deepRestoreRanks([RANKS[0]!], d, pairs));
    expect(err.code).toBe('E_CHECKPOINT_UNSUPPORTED');
    expect(err.message).toMatch(/r580/);
    expect(err.message).toMatch(/restore without a GPU map/);
    expect(d.states.get(1000)).toBe('checkpointed');
  });

  it('the target lacks memory for rank 1: rank 0 is restored and stays locked (reported), a retry with the same map finishes the move', async () => {
    const d = driverOn([0, 1], 4);
    await deepSuspendRanks(RANKS, d);
    const pairs = resolveRemap(engineOn([0, 1]), machine(4), { gpuMap: { 0: 2, 1: 3 } })!.pairs;
    d.full.add(uuid(3));
    const err = await rejection(deepRestoreRanks(RANKS, d, pairs));
    expect(err.details).toMatchObject({ reason: 'memory', ranks: [1], locked: [0] });
    expect(err.message).toMatch(/lacks the memory/);
    expect(err.message).toMatch(/retry with the same GPU map/);
    expect(d.states.get(1000)).toBe('locked');
    expect(d.calls.some((c) => c.startsWith('unlock'))).toBe(false);
    d.full.clear();
    await deepRestoreRanks(RANKS, d, pairs);
    expect(d.notRunning()).toEqual([]);
    expect([d.gpuOf.get(1000), d.gpuOf.get(1001)]).toEqual([uuid(2), uuid(3)]);
  });

  it('an engine that is not deep-suspended is refused (E_ENGINE_STATE), nothing called but state', async () => {
    const d = driverOn([0], 2);
    const pairs = resolveRemap(engineOn([0]), machine(2), { onto: 1 })!.pairs;
    const err = await rejection(deepRestoreRanks([RANKS[0]!], d, pairs));
    expect(err.code).toBe('E_ENGINE_STATE');
    expect(err.message).toMatch(/Suspend it with deep first/);
    expect(d.calls.every((c) => c.startsWith('state'))).toBe(true);
  });

  it('no checkpoint API at all: with a map that is an error, not "nothing to do"', async () => {
    const d = driverOn([0], 2);
    d.unsupported = true;
    const pairs = resolveRemap(engineOn([0]), machine(2), { onto: 1 })!.pairs;
    expect((await rejection(deepRestoreRanks([RANKS[0]!], d, pairs))).code).toBe('E_CHECKPOINT_UNSUPPORTED');
  });
});

const GiB = 1024 ** 3;
/** A machine whose GPUs have `free` bytes free each. */
const withFree = (free: number[]): GpuDevice[] => free.map((f, i) => ({ ...gpu(i), freeMemory: f }));

describe('room on the new GPU, checked before the driver is called', () => {
  const pairsOnto1 = () => resolveRemap(engineOn([0]), machine(2), { onto: 1 })!;

  it('refuses a GPU without room for the process (default estimate), naming needed and free', () => {
    const err = rejectsWith(() => checkRoom(pairsOnto1(), withFree([100 * GiB, 65 * 1024 ** 2]), [0]), 'E_INVALID_ARGUMENT', /not enough free memory on GPU 1 .*65 MiB free, 2048 MiB needed/);
    expect(err.details).toMatchObject({ reason: 'memory', gpus: [{ ordinal: 1, uuid: uuid(1), ranks: [0], needed: DEFAULT_PROCESS_RESERVE_BYTES, free: 65 * 1024 ** 2 }] });
    expect(err.message).toMatch(/still deep-suspended on its own GPU/);
  });

  it('refuses a GPU with room for the process but not for its weights too', () => {
    const err = rejectsWith(() => checkRoom(pairsOnto1(), withFree([0, 5 * GiB]), [4 * GiB]), 'E_INVALID_ARGUMENT', /5120 MiB free, 6144 MiB needed/);
    expect(err.details.gpus).toEqual([{ uuid: uuid(1), ordinal: 1, ranks: [0], needed: 6 * GiB, free: 5 * GiB }]);
  });

  it('passes with room; ontoReserveBytes replaces the estimate; every rank of a multi-GPU move is counted on its own target', () => {
    expect(describeRoom(checkRoom(pairsOnto1(), withFree([0, 7 * GiB]), [4 * GiB]))).toBe('GPU 1: 7168 MiB free, 6144 MiB estimated');
    expect(checkRoom(pairsOnto1(), withFree([0, 5 * GiB]), [4 * GiB], GiB / 2)[0]!.needed).toBe(4.5 * GiB);
    rejectsWith(() => checkRoom(pairsOnto1(), withFree([0, 5 * GiB]), [4 * GiB], -1), 'E_INVALID_ARGUMENT', /reserveBytes/);
    const tp = resolveRemap(engineOn([0, 1]), machine(4), { gpuMap: { 0: 2, 1: 3 } })!;
    const err = rejectsWith(() => checkRoom(tp, withFree([0, 0, 10 * GiB, 3 * GiB]), [2 * GiB, 2 * GiB]), 'E_INVALID_ARGUMENT', /GPU 3/);
    expect((err.details.gpus as unknown[]).length).toBe(1);
  });

  it("uses the plugin's processBytes per rank when the status has it (issue 15), else the estimate; ontoReserveBytes overrides both", () => {
    const measured = (bytes: (number | null | undefined)[]): EngineStatus => {
      const s = engineOn(bytes.map((_, i) => i));
      return { ...s, ranks: s.ranks.map((r, i) => ({ ...r, processBytes: bytes[i] })) } as EngineStatus;
    };
    expect(processReserve(measured([700 * 1024 ** 2, null, undefined]))).toEqual([700 * 1024 ** 2, DEFAULT_PROCESS_RESERVE_BYTES, DEFAULT_PROCESS_RESERVE_BYTES]);
    expect(processReserve(measured([700 * 1024 ** 2]), GiB)).toEqual([GiB]);
    // 700 MiB measured: a GPU with 5 GiB free takes 4 GiB of weights, where the 2 GiB estimate refused it
    const moved = resolveRemap(measured([700 * 1024 ** 2]), machine(2), { onto: 1 })!;
    expect(checkRoom(moved, withFree([0, 5 * GiB]), [4 * GiB])[0]!.needed).toBe(4 * GiB + 700 * 1024 ** 2);
    rejectsWith(() => checkRoom(pairsOnto1(), withFree([0, 5 * GiB]), [4 * GiB]), 'E_INVALID_ARGUMENT', /6144 MiB needed/);
    expect(checkRoom(moved, withFree([0, 5 * GiB]), [4 * GiB], GiB)[0]!.needed).toBe(5 * GiB);
    // two ranks, each its own measurement on its own target: 3 GiB free on GPU 3 now takes rank 1 (the estimate needed 4 GiB)
    const tp = resolveRemap(measured([GiB, GiB / 2]), machine(4), { gpuMap: { 0: 2, 1: 3 } })!;
    expect(checkRoom(tp, withFree([0, 0, 10 * GiB, 3 * GiB]), [2 * GiB, 2 * GiB]).map((r) => r.needed)).toEqual([3 * GiB, 2.5 * GiB]);
    const err = rejectsWith(() => checkRoom(tp, withFree([0, 0, 10 * GiB, 2 * GiB]), [2 * GiB, 2 * GiB]), 'E_INVALID_ARGUMENT', /GPU 3 .*Needed: 512 MiB for rank 1 /);
    expect((err.details.gpus as { needed: number }[])[0]!.needed).toBe(2.5 * GiB);
  });

  it('a refusal makes no driver call but reading the state: still checkpointed, and a plain restore brings it back', async () => {
    const d = new FakeCheckpointDriver([1000]);
    d.gpus = [uuid(0), uuid(1)];
    d.gpuOf.set(1000, uuid(0));
    await deepSuspendRanks([{ rank: 0, pid: 1000 }], d);
    d.calls.length = 0;
    const remap = pairsOnto1();
    const err = await rejection(deepRestoreRanks([{ rank: 0, pid: 1000 }], d, remap.pairs, async () => describeRoom(checkRoom(remap, withFree([0, 1 * GiB]), [GiB]))));
    expect(err.code).toBe('E_INVALID_ARGUMENT');
    expect(err.details.reason).toBe('memory');
    expect(d.calls.every((c) => c.startsWith('state'))).toBe(true);
    expect(d.states.get(1000)).toBe('checkpointed');
    await deepRestoreRanks([{ rank: 0, pid: 1000 }], d);
    expect(d.notRunning()).toEqual([]);
    expect(d.gpuOf.get(1000)).toBe(uuid(0));
  });

  it('the driver still refuses for memory after the check: the message says what was measured and that the process may not be restorable, not that it is still deep-suspended', async () => {
    const d = new FakeCheckpointDriver([1000]);
    d.gpus = [uuid(0), uuid(1)];
    d.gpuOf.set(1000, uuid(0));
    await deepSuspendRanks([{ rank: 0, pid: 1000 }], d);
    d.full.add(uuid(1));
    const remap = pairsOnto1();
    const err = await rejection(deepRestoreRanks([{ rank: 0, pid: 1000 }], d, remap.pairs, async () => describeRoom(checkRoom(remap, withFree([0, 8 * GiB]), [GiB]))));
    expect(err.code).toBe('E_CHECKPOINT');
    expect(err.details).toMatchObject({ reason: 'memory', measured: 'GPU 1: 8192 MiB free, 3072 MiB estimated' });
    expect(err.message).toMatch(/found room \(GPU 1: 8192 MiB free, 3072 MiB estimated/);
    expect(err.message).toMatch(/may not be restorable any more, even in place/);
    expect(err.message).toMatch(/kill the engine's processes, start the engine again and restore it from its snapshot/);
    expect(err.message).not.toMatch(/still deep-suspended|stays checkpointed/);
  });
});

describe('the real binding', () => {
  it('checks the pairs argument; without a driver a remapping restore rejects E_CHECKPOINT_UNSUPPORTED', async (ctx) => {
    const b = native();
    expect(() => b.checkpointRestore(process.pid, 'GPU-0' as never)).toThrow(/pairs must be an array/);
    expect(() => b.checkpointRestore(process.pid, [7] as never)).toThrow(/each pair must be an object/);
    expect(() => b.checkpointRestore(process.pid, [{ oldUuid: uuid(0) }] as never)).toThrow(/newUuid/);
    if ((await b.cudaStatus()).checkpointApi) ctx.skip(); // with the API: the GPU suite covers it
    const err = await rejection(nativeCheckpointBackend().restore(process.pid, [{ oldUuid: uuid(0), newUuid: uuid(1) }]));
    expect(err.code).toBe('E_CHECKPOINT_UNSUPPORTED');
  });
});
