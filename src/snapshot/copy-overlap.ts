import type { NativeTransferResult } from '../native/index.js';
import { runTransfer, type TransferOptions, type TransferRegion } from '../transfer/transfer.js';

/*
 * A copy from the RAM tier in a few jobs, so other work runs beside it:
 *  - the GPU digest of its head runs while its tail is copied. The digest reads GPU memory at HBM
 *    speed (about 1.5 TB/s measured on an H200) while the copy is bound by PCIe (55 GB/s), so the
 *    regions that make up the first 90% of the bytes are copied, then digested while a later job
 *    copies the rest; only the tail's digest is left after the last byte landed;
 *  - targets whose memory is still being made (a restore's fill): the regions with memory are
 *    copied first, the others once it is made;
 *  - regions written by someone else until a promise resolves (the engine's wake): copied after it.
 * Each split costs one drain of the copy pipeline between two jobs (one chunk's DMA, about 1 ms at
 * 64 MiB).
 */

/** The share of the bytes copied before the digest starts. */
const HEAD_SHARE = 0.9;

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

/** One region of a staged copy, named by its region id. @internal */
export interface CopyItem {
  readonly id: string;
  readonly region: TransferRegion;
}

/**
 * What to copy: `first` at once; then, once `rest` resolves, its items in order, those from index
 * `gate.first` on only once `gate.after` resolved (an id may appear in both lists: copied twice,
 * since something else wrote into it between the two). @internal
 */
export interface CopyPlan {
  readonly first: readonly CopyItem[];
  readonly rest?: Promise<{ readonly items: readonly CopyItem[]; readonly gate?: { readonly first: number; readonly after: Promise<void> } }>;
}

/**
 * Copies a plan (op `copy`) in a few jobs, calling `onHead` with the ids of the regions whose bytes
 * are final as soon as the head's job is done (the caller starts their digest): the regions that
 * hold HEAD_SHARE of the bytes, never one copied again later, never one behind the gate. Progress
 * runs over the jobs as one, out of `bytesTotal` (every region once; a region copied again counts
 * once). Per device, the seconds run from the start of the first job to the last byte of the last.
 * When `rest` rejects, the copy of `first` is waited for (the caller's signal stops it) and the
 * rejection is thrown.
 * @internal
 */
export async function copyInStages(
  common: { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>,
  plan: CopyPlan,
  bytesTotal: number,
  onHead: ((ids: readonly string[]) => void) | undefined,
): Promise<NativeTransferResult> {
  const started = performance.now();
  const results: Array<{ at: number; result: NativeTransferResult }> = [];
  let done = 0;
  const job = async (items: readonly CopyItem[]): Promise<void> => {
    if (items.length === 0) return;
    const at = (performance.now() - started) / 1000;
    const offset = done;
    common.onProgress?.({ phase: 'starting', bytesDone: Math.min(offset, bytesTotal), bytesTotal }); // each job's start, for a trace of the stages
    const progress = common.onProgress
      ? { onProgress: (p: Parameters<NonNullable<TransferOptions['onProgress']>>[0]) => common.onProgress!({ ...p, bytesDone: Math.min(offset + p.bytesDone, bytesTotal), bytesTotal }) }
      : {};
    const result = await runTransfer({ ...common, ...progress, op: 'copy', regions: items.map((x) => x.region) });
    done += result.bytes;
    results.push({ at, result });
  };
  const firstJob = job(plan.first);
  let rest: Awaited<NonNullable<CopyPlan['rest']>>;
  try {
    rest = plan.rest ? await plan.rest : { items: [] };
  } catch (err) {
    await firstJob.catch(() => undefined);
    throw err;
  }
  await firstJob;
  const all = [...plan.first, ...rest.items];
  const gateAt = plan.first.length + (rest.gate?.first ?? rest.items.length);
  // The head: up to HEAD_SHARE of the bytes (one region: all of it), not past the gate, at least what is copied already.
  const split = all.length < 2 ? all.length : splitIndex(all.map((x) => x.region.size));
  const k = Math.max(plan.first.length, Math.min(split, gateAt));
  let gateOpen = !rest.gate;
  void rest.gate?.after.then(() => void (gateOpen = true), () => undefined);
  await job(all.slice(plan.first.length, k));
  const startHead = (): void => {
    if (!onHead || k === 0 || k >= all.length) return;
    const later = new Set(all.slice(k).map((x) => x.id));
    onHead(all.slice(0, k).map((x) => x.id).filter((id) => !later.has(id)));
  };
  if (gateOpen) {
    // The tail's copy first, then the head's digest: setting the digest up takes a moment the copy need not wait for.
    const tail = job(all.slice(k));
    try {
      startHead();
    } finally {
      await tail;
    }
  } else {
    startHead();
    await rest.gate?.after;
    await job(all.slice(k));
  }
  const devices = new Map<number, { device: number; bytes: number; seconds: number }>();
  for (const { at, result } of results) {
    for (const d of result.devices ?? []) {
      const seen = devices.get(d.device);
      devices.set(d.device, { device: d.device, bytes: (seen?.bytes ?? 0) + d.bytes, seconds: Math.max(seen?.seconds ?? 0, at + d.seconds) });
    }
  }
  return { bytes: bytesTotal, seconds: (performance.now() - started) / 1000, devices: [...devices.values()] };
}
