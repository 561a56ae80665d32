import { readFileSync } from 'node:fs';

import { describe, expect, it } from 'vitest';

import { native } from '../../src/native/index.js';

// Pinned host memory (the RAM tier's HostBuffer, the staging pools) is kept out of child
// processes (MADV_DONTFORK, native/transfer/host_buffer.h). A process that pins pages and then
// forks has Linux copy every pinned page into the child (since 5.9, "mm: Do early cow for pinned
// pages during fork()"; huge pages are split first), with the forking thread blocked and as
// much memory again until the child execs. (The likely reason the swap bench's RAM-tier rows on
// the H200, holding a 33.5 GiB pinned RAM tier, spent ~12 s between swaps, each spawning
// nvidia-smi, where the tier-0 rows spent 2.5 s.) Without pinning the same flag is set, so it is
// checked here, in /proc/self/smaps ("dc": do not copy this area on fork).

interface Mapping {
  start: bigint;
  sizeBytes: number;
  flags: string[];
}

function mappings(): Mapping[] {
  const out: Mapping[] = [];
  for (const line of readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) /.exec(line);
    if (head) out.push({ start: BigInt(`0x${head[1]}`), sizeBytes: Number(BigInt(`0x${head[2]}`) - BigInt(`0x${head[1]}`)), flags: [] });
    else if (line.startsWith('VmFlags:')) out.at(-1)!.flags = line.slice('VmFlags:'.length).trim().split(/\s+/);
  }
  return out;
}

/** The mappings of exactly `size` bytes that fork() leaves out of the child. */
const keptFromChildren = (size: number): number => mappings().filter((m) => m.sizeBytes === size && m.flags.includes('dc')).length;

const MiB = 1024 * 1024;

describe('pinned host memory is kept out of child processes', () => {
  it('the RAM tier buffer: MADV_DONTFORK while it lives, gone when closed', async () => {
    const size = 64 * MiB + 3 * 4096; // a size no other mapping of this process has
    const before = keptFromChildren(size);
    const buffer = await native().createHostBuffer(size, -1);
    try {
      expect(keptFromChildren(size)).toBe(before + 1);
    } finally {
      buffer.close();
    }
    expect(keptFromChildren(size)).toBe(before);
  });

  it('a staging pool: MADV_DONTFORK over all its slots', async () => {
    const slot = MiB + 5 * 4096;
    const pool = await native().createStagingPool(slot, 3, -1);
    try {
      expect(keptFromChildren(3 * slot)).toBe(1);
    } finally {
      pool.close();
    }
    expect(keptFromChildren(3 * slot)).toBe(0);
  });
});
