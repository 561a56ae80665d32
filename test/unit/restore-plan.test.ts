import { describe, expect, it } from 'vitest';

import type { RamTier } from '../../src/cache/ram-tier.js';
import type { NeighbourTier } from '../../src/cache/neighbour-tier.js';
import { GpuTier } from '../../src/cache/gpu-tier.js';
import type { EngineStatus } from '../../src/engine/engine-client.js';
import { planRestore, planTargets, type PlanInput } from '../../src/flows/restore-plan.js';
import type { EngineRestoreOptions } from '../../src/flows/types.js';

// A restore's choices, decided without an engine (src/flows/restore-plan.ts).

const ENGINE = 'http://127.0.0.1:8000';
/** A RAM tier that holds the captures named (only `has` and `fits` are read by a plan). */
const ram = (...ids: string[]): RamTier => ({ has: (id: string) => ids.includes(id), fits: () => true }) as unknown as RamTier;
const input = (options: EngineRestoreOptions, snapshot: PlanInput['snapshot'] = { id: 's1', durable: true }, awaitsRoom = false): PlanInput => ({ options, snapshot, engine: ENGINE, awaitsRoom });

describe('planRestore: what a restore does, decided before the engine is touched', () => {
  it('tries the tiers fastest first, the store last', () => {
    const resident = new GpuTier();
    try {
      expect(planRestore(input({})).tiers).toEqual(['store']);
      expect(planRestore(input({ tiers: { ram: ram(), gpu: resident, engine: true } })).tiers).toEqual(['engine', 'gpu', 'ram', 'store']);
    } finally {
      resident.close();
    }
  });

  it('makes the first part of the memory early only where memory made here surely takes the copy, and copies into it where the RAM tier holds the snapshot', () => {
    expect(planRestore(input({}))).toMatchObject({ earlyFill: true, earlyCopy: false });
    expect(planRestore(input({ tiers: { ram: ram('s1') } }))).toMatchObject({ earlyFill: true, earlyCopy: true });
    expect(planRestore(input({ tiers: { ram: ram('other') } }))).toMatchObject({ earlyFill: true, earlyCopy: false });
    // a capture only in a RAM tier that no longer holds it: nothing to copy from, so nothing made
    expect(planRestore(input({ tiers: { ram: ram() } }, { id: 's1', durable: false }))).toMatchObject({ earlyFill: false, earlyCopy: false });
    expect(planRestore({ ...input({}), snapshot: undefined })).toMatchObject({ earlyFill: false });
    for (const elsewhere of [
      { move: { onto: 1 } },
      { allowModelSwap: true },
      { tiers: { engine: true } },
      { tiers: { neighbour: {} as NeighbourTier } },
      { tiers: { ram: ram('s1'), multipath: { neighbour: 1 } } },
    ] as EngineRestoreOptions[]) {
      expect(planRestore(input(elsewhere)), JSON.stringify(Object.keys(elsewhere))).toMatchObject({ earlyFill: false, earlyCopy: false });
    }
  });

  it('makes nothing early when tier 0 holds this engine, only when it holds another', () => {
    const holding = { has: (engine: string) => engine === ENGINE } as unknown as GpuTier; // only `has` is read by a plan
    expect(planRestore(input({ tiers: { gpu: holding } })).earlyFill).toBe(false);
    expect(planRestore({ ...input({ tiers: { gpu: holding } }), engine: 'http://127.0.0.1:8001' }).earlyFill).toBe(true);
  });

  it('checks what the options ask (chunks before copy, GPU digests, logprobs bit for bit by default), and refuses a bad recovery before anything', () => {
    expect(planRestore(input({})).checks).toEqual({ blobs: 'chunk', digests: true, logprobTolerance: 0 });
    expect(planRestore(input({ verify: { blobs: 'all-first', digests: false, logprobTolerance: 0.01 } })).checks).toEqual({ blobs: 'all-first', digests: false, logprobTolerance: 0.01 });
    expect(planRestore(input({ recovery: { policy: 'reload', materialize: 'async' } })).recovery).toEqual({ reload: true, materialize: 'async', codec: 'off' });
    expect(planRestore(input({ recovery: { policy: 'reload', materialize: 'async', codec: 'vsnap-c1' } })).recovery).toEqual({ reload: true, materialize: 'async', codec: 'vsnap-c1' });
    expect(() => planRestore(input({ recovery: 'retry' as never }))).toThrow(/recovery/);
    expect(() => planRestore(input({ recovery: { policy: 'reload', codec: 'zstd' as never } }))).toThrow(/codec/);
    expect(() => planRestore(input({ recovery: { policy: 'reload', materialise: 'async' } as never }))).toThrow(/no option 'materialise'/);
  });

  it("a swap's gate: the KV cache waits for the other engine's sleep, and a failed restore never wakes it to sleep again", () => {
    expect(planRestore(input({ overlapKvWake: true }, undefined, true))).toMatchObject({ kvBesideHydrate: true, awaitsRoom: true });
    expect(planRestore(input({}))).toMatchObject({ kvBesideHydrate: false, awaitsRoom: false });
  });
});

describe('planTargets: memory made here, or the engine\'s own weights mapped, once the engine was read', () => {
  const status = (ranks: Array<{ describe?: boolean; weightsMapped: boolean }>, sleeping = true): EngineStatus => ({ sleeping, ranks }) as unknown as EngineStatus;
  it('fills memory made here where every rank sleeps unmapped and its plugin describes its regions', () => {
    expect(planTargets(status([{ describe: true, weightsMapped: false }, { describe: true, weightsMapped: false }]), undefined)).toBe('fill');
  });
  it('maps the engine\'s own weights for an older plugin, a rank that woke, an awake engine, or a move', () => {
    expect(planTargets(status([{ weightsMapped: false }]), undefined)).toBe('map');
    expect(planTargets(status([{ describe: true, weightsMapped: false }, { describe: true, weightsMapped: true }]), undefined)).toBe('map');
    expect(planTargets(status([{ describe: true, weightsMapped: false }], false), undefined)).toBe('map');
    expect(planTargets(status([{ describe: true, weightsMapped: false }]), { pairs: [] } as never)).toBe('map');
  });
});
