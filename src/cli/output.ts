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
export function formatRate(bytes: number, seconds: number): string {
  return `${(bytes / Math.max(seconds, 1e-9) / 1e9).toFixed(2)} GB/s`;
}

/** A one-line progress display on stderr when it is a terminal (nothing otherwise). */
export function progressLine(label: string): { update: (p: TransferProgress) => void; done: () => void } {
  const tty = process.stderr.isTTY;
  let shown = false;
  return {
    update(p) {
      if (!tty) return;
      const pct = p.bytesTotal > 0 ? Math.floor((100 * p.bytesDone) / p.bytesTotal) : 100;
      process.stderr.write(`\r${label}: ${p.phase} ${pct}% (${formatBytes(p.bytesDone)} of ${formatBytes(p.bytesTotal)})   `);
      shown = true;
    },
    done() {
      if (tty && shown) process.stderr.write('\r\x1b[2K');
    },
  };
}
