import type { NativeTransferResult } from '../native/index.js';
import { runTransfer, type TransferOptions, type TransferRegion } from '../transfer/transfer.js';

/*
 * A copy from the RAM tier with the GPU digest of its head overlapped with the copy of its tail.
 * The digest reads GPU memory at HBM speed (about 1.5 TB/s measured on an H200) while the copy is
 * bound by PCIe (55 GB/s), so the two barely meet: the regions that make up the first part of the
 * bytes are copied by one job, then digested while a second job copies the rest; only the tail's
 * digest is left after the last byte landed. The split costs one drain of the copy pipeline
 * between the two jobs (one chunk's DMA, about 1 ms at 64 MiB).
 */

/** The share of the bytes copied before the digest starts. */
const HEAD_SHARE = 0.85;

/** Where to split: the first regions holding at least HEAD_SHARE of the bytes, leaving at least one region for the tail. */
export function splitIndex(sizes: readonly number[]): number {
  const total = sizes.reduce((n, s) => n + s, 0);
  let sum = 0;
  for (let i = 0; i < sizes.length - 1; i++) {
    sum += sizes[i]!;
    if (sum >= total * HEAD_SHARE) return i + 1;
  }
  return sizes.length - 1;
}

/**
 * Copies `regions` (op `copy`) in two jobs, calling `onHead` with the indices of the regions the
 * first job wrote as soon as it is done (the caller starts their digest). Progress runs over both
 * jobs as one. Per device, the seconds run from the start of the first job to the last byte of the
 * second. With fewer than two regions, one job and no `onHead`. With `gate`, the regions from
 * index `gate.first` on are in the second job, which starts only once `gate.after` resolved (they
 * are never in the head: its digest could run before someone else's last write).
 * @internal
 */
export async function copyWithEarlyDigest(
  common: { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>,
  regions: readonly TransferRegion[],
  onHead: (indices: readonly number[]) => void,
  gate?: { readonly first: number; readonly after: Promise<void> },
): Promise<NativeTransferResult> {
  if (regions.length < 2 || gate?.first === 0) {
    await gate?.after;
    return runTransfer({ ...common, op: 'copy', regions: [...regions] });
  }
  const k = Math.min(splitIndex(regions.map((r) => r.size)), gate?.first ?? regions.length - 1);
  const total = regions.reduce((n, r) => n + r.size, 0);
  const started = performance.now();
  const progress = (offset: number) =>
    common.onProgress ? { onProgress: (p: Parameters<NonNullable<TransferOptions['onProgress']>>[0]) => common.onProgress!({ ...p, bytesDone: offset + p.bytesDone, bytesTotal: total }) } : {};
  const head = await runTransfer({ ...common, ...progress(0), op: 'copy', regions: regions.slice(0, k) });
  onHead(Array.from({ length: k }, (_, i) => i));
  await gate?.after;
  const tailStart = (performance.now() - started) / 1000;
  const tail = await runTransfer({ ...common, ...progress(head.bytes), op: 'copy', regions: regions.slice(k) });
  const devices = new Map<number, { device: number; bytes: number; seconds: number }>();
  for (const d of head.devices ?? []) devices.set(d.device, { ...d });
  for (const d of tail.devices ?? []) {
    const seen = devices.get(d.device);
    devices.set(d.device, { device: d.device, bytes: (seen?.bytes ?? 0) + d.bytes, seconds: tailStart + d.seconds });
  }
  return { bytes: head.bytes + tail.bytes, seconds: (performance.now() - started) / 1000, devices: [...devices.values()] };
}
