import type { RamLease } from '../cache/ram-tier.js';
import type { RegionInfo } from '../manifest/types.js';
import { regionId } from '../manifest/region-id.js';
import type { NativeTransferResult } from '../native/index.js';
import { invalidArgument } from '../errors.js';
import type { RegionMemory } from '../regions/memory.js';
import { CopyQueue, type CopyBatch } from '../transfer/copy-queue.js';
import type { CopyItem, StartedCopy } from './copy-types.js';
import type { TransferOptions } from '../transfer/transfer.js';
import type { RestoreRegion } from './snapshot-types.js';
import type { StagedRest, StagedTargets } from './staged.js';

/*
 * A copy from the RAM tier in stages, so other work runs beside it:
 *  - the GPU digest of its head runs while its tail is copied. The digest reads GPU memory at HBM
 *    speed (about 1.5 TB/s measured on an H200) while the copy is bound by PCIe (55 GB/s), so the
 *    regions that make up the first 90% of the bytes are copied, then digested while the rest is
 *    copied; only the tail's digest is left after the last byte landed;
 *  - targets whose memory is still being made (a restore's fill): the regions with memory are
 *    copied first, the others once it is made;
 *  - regions written by someone else until a promise resolves (the engine's wake): copied after it.
 * The stages are batches of one copy queue (src/transfer/copy-queue.ts): each is queued as soon as
 * it is ready, behind the ones before it, so the copy engine never waits between two stages; the
 * first can be queued before the restore has read the engine (startCopy).
 */

export type { CopyItem, StartedCopy } from './copy-types.js';

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

/**
 * What to copy: `first` at once; then, once `rest` resolves, its items in order, those from index
 * `gate.first` on only once `gate.after` resolved (an id may appear in both lists: copied twice,
 * since something else wrote into it between the two). @internal
 */
export interface CopyPlan {
  readonly first: readonly CopyItem[];
  /** Items copied as they come, after `first` and before `rest`'s (each only once: `rest` does not list them again, but for those behind its gate). */
  readonly more?: AsyncIterable<readonly CopyItem[]>;
  readonly rest?: Promise<{ readonly items: readonly CopyItem[]; readonly gate?: { readonly first: number; readonly after: Promise<void> } }>;
}

/**
 * A region's copy from the RAM tier (`lease`, which holds the snapshot) into `memory`: named by its
 * key, prefixed with its rank when the snapshot has several.
 * @internal
 */
export function ramCopyItem(rank: number, region: RegionInfo, lease: RamLease, memory: RegionMemory, multiRank: boolean): CopyItem {
  const id = regionId(rank, region.key);
  return {
    id,
    region: {
      name: multiRank ? `rank ${rank}/${region.key}` : region.key,
      size: region.size,
      chunkSize: region.chunkSize,
      hostCopy: { kind: 'buffer', buffer: lease.buffer, offset: lease.offsets.get(id)! },
      memory,
    },
  };
}

/**
 * What a restore from the RAM tier copies, in which order: with stages (memory being made), the
 * `first` regions at once; the rest's batches as they come (`stages.more`: those holding a tensor
 * of the model; one without may be written by someone else, which `staged` says); then, once
 * `staged` resolved, the others, those written by someone else until `late.after` last, after it
 * (and again if among the first or streamed). Without stages, every region in one go.
 * @internal
 */
export function ramCopyPlan(
  all: ReadonlyArray<{ readonly rank: number; readonly region: RegionInfo }>,
  memoryOf: (id: string) => RegionMemory,
  lease: RamLease,
  multiRank: boolean,
  stages: Pick<StagedTargets, 'first' | 'more'> | undefined,
  staged: Promise<StagedRest> | undefined,
): CopyPlan {
  type Entry = (typeof all)[number];
  const id = (x: Entry): string => regionId(x.rank, x.region.key);
  const item = (x: Entry, memory = memoryOf(id(x))): CopyItem => ramCopyItem(x.rank, x.region, lease, memory, multiRank);
  const inFirst = (x: Entry): boolean => !!stages?.first.has(id(x));
  const byId = new Map(all.map((x) => [id(x), x]));
  const streamed = new Set<string>();
  const more = stages?.more;
  // A snapshot that describes no tensor at all (regions captured without their tensors): every region is streamed.
  const described = all.some((x) => x.region.tensors.length > 0);
  let consumed!: () => void; // every streamed batch taken by the copy: `streamed` is final
  const streamDone = more ? new Promise<void>((resolve) => (consumed = resolve)) : Promise.resolve();
  return {
    first: all.filter(inFirst).map((x) => item(x)),
    ...(more ? { more: streamedItems(more, byId, streamed, item, described, () => consumed()) } : {}),
    rest: (staged ?? Promise.resolve(undefined)).then(async (rest) => {
      await streamDone;
      const late = (x: Entry): boolean => !!rest?.late.ids.has(id(x));
      const others = all.filter((x) => !inFirst(x) && !streamed.has(id(x)));
      const order = [...others.filter((x) => !late(x)), ...all.filter(late)];
      const gate = rest && order.some(late) ? { first: order.findIndex(late), after: rest.late.after } : undefined;
      return { items: order.map((x) => item(x)), ...(gate ? { gate } : {}) };
    }),
  };
}

/**
 * The copy items of a restore's streamed batches (StagedTargets.more): each region a region of the
 * snapshot, of its size (else the batch fails the restore); only those holding a tensor of the model
 * (every one, where the snapshot describes no tensor: as firstRegions takes the largest of all then)
 * are copied as they come, and recorded in `streamed`; `done` once the last batch was taken (or the stream failed).
 */
async function* streamedItems(
  more: AsyncIterable<readonly RestoreRegion[]>,
  byId: ReadonlyMap<string, { rank: number; region: RegionInfo }>,
  streamed: Set<string>,
  item: (x: { rank: number; region: RegionInfo }, memory: RestoreRegion['memory']) => CopyItem,
  described: boolean,
  done: () => void,
): AsyncGenerator<readonly CopyItem[]> {
  try {
    for await (const batch of more) {
      const items: CopyItem[] = [];
      for (const r of batch) {
        const id = regionId(r.rank ?? 0, r.key);
        const x = byId.get(id);
        if (!x || x.region.size !== r.size) invalidArgument('stages.more', 'regions of the snapshot, each of its size', r.key);
        if (described && x.region.tensors.length === 0) continue;
        streamed.add(id);
        items.push(item(x, r.memory));
      }
      yield items;
    }
  } finally {
    done();
  }
}

/** A copy's progress and cancellation, and its label in errors. @internal */
export type CopyCommon = { label: string } & Pick<TransferOptions, 'onProgress' | 'signal' | 'threads'>;

/**
 * Opens a copy queue and queues `first` on it at once (restoreEngine: before the engine has
 * answered, into memory made for it). `bytesTotal` is what the whole copy will move (progress).
 * @internal
 */
export function startCopy(common: CopyCommon, first: readonly CopyItem[], bytesTotal: number): StartedCopy {
  const started = performance.now();
  const onProgress = common.onProgress;
  const queue = CopyQueue.open(common.label, {
    signal: common.signal,
    ...(onProgress ? { onLanded: (landed: number) => onProgress({ phase: 'copying', bytesDone: Math.min(landed, bytesTotal), bytesTotal }) } : {}),
  });
  const batches: Promise<CopyBatch>[] = [];
  const landed = push(queue, first, batches, common, bytesTotal);
  return {
    queue,
    first,
    landed,
    started,
    batches,
    abandon: async () => {
      queue.cancel();
      await queue.close();
    },
  };
}

/**
 * The parts a stage is queued in: the first LEAD_PART regions, then parts up to PART_GROWTH times
 * the one before. Queueing a region costs the JS thread one to two microseconds (its memory and source
 * read into the native queue), copying one of a few MiB tens of microseconds: in parts, the copy
 * starts once the first few are queued and each later part is queued while the one before is
 * copied, instead of the first byte waiting for thousands of regions to be queued.
 * @internal
 */
export function pushParts(count: number): number[] {
  const parts: number[] = [];
  for (let at = 0, size = LEAD_PART; at < count; at += size, size *= PART_GROWTH) parts.push(Math.min(size, count - at));
  return parts.length ? parts : [0];
}
const LEAD_PART = 16;
const PART_GROWTH = 16;

/**
 * Queues `items` (none: a batch that lands at once) in parts (pushParts), reporting the stage's
 * start; resolves with the last part's batch once every part landed. Every promise has a handler
 * attached; each part's batch is in `batches`.
 */
function push(queue: CopyQueue, items: readonly CopyItem[], batches: Promise<CopyBatch>[], common: CopyCommon, bytesTotal: number): Promise<CopyBatch> {
  common.onProgress?.({ phase: 'starting', bytesDone: Math.min(queue.landed, bytesTotal), bytesTotal }); // each stage's start, for a trace of the stages
  const parts: Promise<CopyBatch>[] = [];
  let at = 0;
  for (const n of pushParts(items.length)) {
    const batch = queue.push(items.slice(at, (at += n)).map((x) => x.region));
    batch.catch(() => undefined); // awaited by the caller on every path
    batches.push(batch);
    parts.push(batch);
  }
  const all = Promise.all(parts).then((landed) => landed[landed.length - 1]!);
  all.catch(() => undefined);
  return all;
}

/**
 * Copies a plan in stages, calling `onHead` with the ids of the regions whose bytes are final as
 * soon as the head has landed (the caller starts their digest): the regions that hold HEAD_SHARE
 * of the bytes, never one copied again later, never one behind the gate. With `started`, the
 * first stage is queued already (plan.first is ignored). Progress runs over the stages as one,
 * out of `bytesTotal` (every region once). Per device, the seconds run from the first copy issued
 * to the last byte landed. When `rest` rejects, the copy of the first stage is waited for (the
 * caller's signal stops it) and the rejection is thrown. Nothing is in flight once it settles.
 * @internal
 */
export async function copyInStages(
  common: CopyCommon,
  plan: CopyPlan,
  bytesTotal: number,
  onHead: ((ids: readonly string[]) => void) | undefined,
  started?: StartedCopy,
): Promise<NativeTransferResult> {
  const copy = started ?? startCopy(common, plan.first, bytesTotal);
  const first = copy.first;
  const { queue, batches } = copy;
  // A copy started earlier listens to the signal it was started with; this one's stops it too.
  const stop = (): void => queue.cancel();
  if (started) {
    common.signal?.addEventListener('abort', stop, { once: true });
    if (common.signal?.aborted) queue.cancel();
  }
  try {
    // Batches of the rest queued as they come, behind the first.
    const streamed: CopyItem[] = [];
    const streaming = (async () => {
      if (!plan.more) return;
      for await (const batch of plan.more) {
        if (batch.length === 0) continue;
        streamed.push(...batch);
        void push(queue, batch, batches, common, bytesTotal);
      }
    })();
    streaming.catch(() => undefined); // awaited below
    let rest: Awaited<NonNullable<CopyPlan['rest']>>;
    try {
      rest = plan.rest ? await plan.rest : { items: [] };
      await streaming;
    } catch (err) {
      await streaming.catch(() => undefined);
      await copy.landed.catch(() => undefined);
      throw err;
    }
    const queued = [...first, ...streamed];
    const all = [...queued, ...rest.items];
    const gateAt = queued.length + (rest.gate?.first ?? rest.items.length);
    // The head: up to HEAD_SHARE of the bytes (one region: all of it), not past the gate, at least what is queued already.
    const split = all.length < 2 ? all.length : splitIndex(all.map((x) => x.region.size));
    const k = Math.max(queued.length, Math.min(split, gateAt));
    const head = push(queue, all.slice(queued.length, k), batches, common, bytesTotal);
    // The tail behind the head at once, or once the gate opens.
    const tail = rest.gate ? rest.gate.after.then(() => push(queue, all.slice(k), batches, common, bytesTotal)) : push(queue, all.slice(k), batches, common, bytesTotal);
    tail.catch(() => undefined); // awaited below
    await copy.landed;
    await head;
    if (onHead && k > 0 && k < all.length) {
      const later = new Set(all.slice(k).map((x) => x.id));
      onHead(all.slice(0, k).map((x) => x.id).filter((id) => !later.has(id)));
    }
    await tail;
  } catch (err) {
    queue.cancel(); // a stage failed (and so does every later one) or the gate did: nothing more is copied
    await queue.close();
    throw err;
  } finally {
    common.signal?.removeEventListener('abort', stop);
  }
  await queue.close();
  const landed = await Promise.all(batches);
  common.onProgress?.({ phase: 'done', bytesDone: bytesTotal, bytesTotal });
  const issued = landed.filter((b) => b.issuedAt >= 0);
  const from = issued.length ? Math.min(...issued.map((b) => b.issuedAt)) : 0;
  const devices = new Map<number, { device: number; bytes: number; seconds: number }>();
  for (const b of landed) {
    for (const d of b.devices) {
      const seen = devices.get(d.device);
      devices.set(d.device, { device: d.device, bytes: (seen?.bytes ?? 0) + d.bytes, seconds: Math.max(seen?.seconds ?? 0, b.landedAt - from) });
    }
  }
  return { bytes: bytesTotal, seconds: (performance.now() - copy.started) / 1000, devices: [...devices.values()] };
}
