import { readSync, writeSync } from 'node:fs';

import { VsnapError } from '../../src/errors.js';
import type { NeighbourBackend } from '../../src/cache/neighbour-tier.js';
import { HostRegion } from '../../src/regions/host-region.js';
import type { RegionMemory } from '../../src/regions/memory.js';

/**
 * A NeighbourTier backend on host memory, for engines whose weights are host memory (the CPU
 * reference engine): every memfd it did not allocate is on "GPU 0", what it allocates (the
 * parked copies) on the tier's GPU; a peer copy is a host copy. As in the native peer copy, memory
 * a running copy uses is freed only when the copy ends (close() while it runs is deferred).
 */
export function hostPeerBackend(options: { granularity?: number; engineDevice?: number } = {}) {
  const parked = new Map<number, HostRegion>();
  const pendingClose = new Set<HostRegion>();
  let running = 0;
  const hooks: { beforeRestoreCopy?: () => void | Promise<void>; failRestoreCopy?: boolean} = {};
  const copies: Array<{ device: number; restore: boolean; bytes: number }> = [];
  const fdOf = (m: RegionMemory): number => (m.kind === 'host' ? m.fd : -1);
  const flush = (): void => {
    if (running > 0) return;
    for (const r of pendingClose) r.close();
    pendingClose.clear();
  };
  const backend: NeighbourBackend = {
    deviceOf: (m) => (m.kind === 'host' ? (parked.has(m.fd) ? 1 : (options.engineDevice ?? 0)) : undefined),
    granularity: async () => options.granularity ?? 64 * 1024,
    async allocate(_device, size) {
      const r = HostRegion.create(size, 'parked');
      parked.set(r.fd, r);
      let closed = false;
      return {
        memory: r.memory,
        close: () => {
          if (closed) return;
          closed = true;
          parked.delete(r.fd);
          pendingClose.add(r);
          flush();
        },
      };
    },
    async copy(device, pairs) {
      const restore = pairs.some((p) => parked.has(fdOf(p.src)) || [...pendingClose].some((r) => r.fd === fdOf(p.src)));
      running++;
      try {
        if (restore) await hooks.beforeRestoreCopy?.();
        if (restore && hooks.failRestoreCopy) throw new VsnapError('E_CUDA', 'injected fault: the peer copy failed');
        let bytes = 0;
        for (const p of pairs) {
          const buf = Buffer.alloc(p.size);
          readSync(fdOf(p.src), buf, 0, p.size, 0);
          writeSync(fdOf(p.dst), buf, 0, p.size, 0);
          bytes += p.size;
        }
        copies.push({ device, restore, bytes });
        return { bytes, seconds: 0.001 };
      } finally {
        running--;
        flush();
      }
    },
  };
  /** Parked memfds still open (allocated and not yet freed). */
  const openCount = (): number => parked.size + pendingClose.size;
  /** Flips a byte of one parked copy (memory going bad on the neighbour). */
  const damage = (): void => {
    const r = [...parked.values()].find((x) => x.size > 16)!;
    const b = Buffer.alloc(1);
    readSync(r.fd, b, 0, 1, 8);
    b[0] = b[0]! ^ 0xff;
    writeSync(r.fd, b, 0, 1, 8);
  };
  return { backend, hooks, copies, openCount, damage };
}
