import { SingleBar } from 'cli-progress';

import type { TransferProgress } from '../transfer/transfer.js';

/** Human byte counts: 1.50 GiB. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${u === 0 ? v : v.toFixed(2)} ${units[u]}`;
}

/** Decimal throughput, the way link speeds are quoted: 54.8 GB/s. */
/** Stored bytes against raw bytes, as `0.70x` (`1.00x` for nothing). */
export function formatRatio(stored: number, raw: number): string {
  return `${(raw > 0 ? stored / raw : 1).toFixed(2)}x`;
}

export function formatRate(bytes: number, seconds: number): string {
  return `${(bytes / Math.max(seconds, 1e-9) / 1e9).toFixed(2)} GB/s`;
}

/** A progress bar on stderr when it is a terminal (nothing otherwise, e.g. with --json in scripts). */
export function progressLine(label: string): { update: (p: TransferProgress) => void; done: () => void } {
  if (!process.stderr.isTTY) return { update: () => undefined, done: () => undefined };
  const bar = new SingleBar({
    stream: process.stderr,
    format: `${label} {phase} [{bar}] {percentage}% {done} of {total}`,
    hideCursor: true,
    clearOnComplete: true,
  });
  let started = false;
  return {
    update(p) {
      const payload = { phase: p.phase.padEnd(9), done: formatBytes(p.bytesDone), total: formatBytes(p.bytesTotal) };
      if (!started) {
        bar.start(Math.max(p.bytesTotal, 1), p.bytesDone, payload);
        started = true;
      } else {
        bar.setTotal(Math.max(p.bytesTotal, 1));
        bar.update(p.bytesDone, payload);
      }
    },
    done() {
      if (started) bar.stop();
    },
  };
}
