// `npm run bench -- swap`: two reference engines of the same size (seeds 1 and 2, 16.74 GiB of
// weights each with the defaults --layers 36 --hidden 4096), one awake and one asleep, swapped back
// and forth through vsnap's public API, once per tier a restore can come from and per overlap mode.
// One swap = suspendEngine of the awake engine + restoreEngine of the other (or swapEngines, for the
// overlap modes weights and all), timed from the start of the suspend until the restore resolves;
// after it the woken engine must give its first answer. The rows, what each measures and needs:
// bench/results/README.md#swap-benchmark-rows; `sweep` is bench/swap-sweep.ts, `vllm-l1`
// bench/swap-vllm.ts, the tables bench/swap-report.ts. Options and their defaults: parseArgs below.
// Writes <out>/engine-swap-<GiB>GiB.json (every swap) and .md, prints the tables; progress on stderr.
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual, parseArgs } from 'node:util';

import { captureEngine, cudaStatus, EngineClient, type EngineRestoreOptions, type EngineSuspendOptions, RamTier, type Manifest, RegionStore, GpuTier, restoreEngine, type Snapshot, suspendEngine, swapEngines } from '../src/index.js';
import { listDevices, releaseIdleResources } from '../src/plumbing.js';
import { dropCaches, GiB, MiB, since } from './common.js';
import { type Answer, askCapital, engineTierUnsupported, type ReferenceEngine, startEngine } from './engine.js';
import { bytesAloneOf, bytesAloneTable, type Ceiling, cell, f, type ModeRow, type PhaseRow, phaseTable, stats, sweepTable, type SweepRow, targetsTable, vllmTable } from './swap-report.js';
import { runCeiling, runSweep } from './swap-sweep.js';
import { gpuBytesOf, runVllmLevel1, type VllmLevel1Result } from './swap-vllm.js';

const WARMUP = 2; // unmeasured swaps at the start of each row but cold (tier 0 needs both engines' weights held)
const COLD_REPS = 2;
const PROBE_TOKENS = 16;

type RowName = 'tier0' | 'engine' | 'ram' | 'ram-coded' | 'ram2' | 'pagecache' | 'cold';
type Tier = 'gpu' | 'neighbour' | 'ram' | 'store' | 'engine';
type Overlap = 'none' | 'kv' | 'weights' | 'all';
// The RAM rows before the engine row: a failure there cannot cost them; cold last, after the page cache was used.
const ROWS: readonly RowName[] = ['tier0', 'ram', 'ram-coded', 'ram2', 'engine', 'pagecache', 'cold'];
const EXTRA = ['sweep', 'vllm-l1'] as const;
const ALL_ROWS = ['sweep', 'tier0', 'ram', 'ram-coded', 'ram2', 'vllm-l1', 'engine', 'pagecache', 'cold'];
const OVERLAPS: readonly Overlap[] = ['none', 'kv', 'weights', 'all'];
/** The rows the overlap modes apply to (the others run without overlap). */
const OVERLAP_ROWS: readonly RowName[] = ['tier0', 'ram', 'ram-coded', 'ram2'];
const LABEL: Record<RowName, string> = {
  tier0: 'tier 0 (weights kept on the GPU)',
  engine: "tier 0, the engine's own (weights kept in the engine, KV cache released)",
  ram: 'RAM tier (hot, pinned RamTier)',
  'ram-coded': "RAM tier, coded (pinned RamTier, codec 'vsnap-c1')",
  ram2: 'RAM tier over two PCIe links (multipath)',
  pagecache: 'page cache (warm disk)',
  cold: 'cold disk (caches dropped, O_DIRECT)',
};

const { values: args } = parseArgs({
  options: {
    device: { type: 'string', default: 'cuda' },
    layers: { type: 'string', default: '36' },
    hidden: { type: 'string', default: '4096' },
    reps: { type: 'string', default: '5' },
    rows: { type: 'string', default: ALL_ROWS.join(',') },
    'sweep-regions': { type: 'string', default: '36,252,1000,4000' },
    'sweep-gib': { type: 'string' },
    ceiling: { type: 'string', default: 'dist-gpu/ceiling' },
    'vllm-cycles': { type: 'string', default: '3' },
    out: { type: 'string', default: 'bench/results' },
    store: { type: 'string', default: '/tmp/vsnap-swap-store' },
    overlap: { type: 'string', default: OVERLAPS.join(',') },
    neighbour: { type: 'string', default: '1' },
  },
  strict: true,
});
const device = args.device;
if (device !== 'cuda' && device !== 'host') throw new Error(`--device must be cuda or host, not ${JSON.stringify(device)}`);
const positive = (name: string, v: string): number => {
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`--${name} must be a positive integer, not ${JSON.stringify(v)}`);
  return n;
};
/** A comma-separated option's items, each one of `known`. */
const listOf = <T extends string>(name: string, known: readonly string[], what: string): T[] => {
  const items = args[name as 'rows' | 'overlap'].split(',').map((x) => x.trim()).filter(Boolean);
  for (const x of items) if (!known.includes(x)) throw new Error(`--${name}: unknown ${what} ${JSON.stringify(x)} (${what}s: ${known.join(', ')})`);
  return items as T[];
};
const layers = positive('layers', args.layers);
const hidden = positive('hidden', args.hidden);
const reps = positive('reps', args.reps);
const selected = listOf<string>('rows', ALL_ROWS, 'row');
const rowsToRun = ROWS.filter((r) => selected.includes(r)); // always in this order: cold last, after the page cache was used
const extras = EXTRA.filter((r) => selected.includes(r));
const sweepCounts = args['sweep-regions'].split(',').map((x) => positive('sweep-regions', x.trim()));
// On the host the sweep's bytes are memfds: a small default keeps a dry run quick (timings there mean nothing).
const sweepBytes = Math.round(Number(args['sweep-gib'] ?? (device === 'cuda' ? '16' : '0.25')) * 1024 ** 3);
const vllmCycles = positive('vllm-cycles', args['vllm-cycles']);
const neighbour = Number(args.neighbour);
if (!Number.isInteger(neighbour) || neighbour < 0) throw new Error(`--neighbour must be a GPU ordinal, not ${JSON.stringify(args.neighbour)}`);
const overlaps = listOf<Overlap>('overlap', OVERLAPS, 'mode');
if (overlaps.length === 0) throw new Error('--overlap: at least one mode');
const needEngines = rowsToRun.length > 0 || extras.includes('vllm-l1');

const T0 = performance.now();
const log = (m: string): void => console.error(`[${((performance.now() - T0) / 1000).toFixed(1).padStart(6)} s] ${m}`);
const gib = (bytes: number): string => (bytes / GiB).toFixed(2);
const ms = (s: number): string => `${(s * 1000).toFixed(0)} ms`;
/** The median of the numbers among `values`, or null for none. */
const medianOf = (values: ReadonlyArray<number | null | undefined>): number | null => stats(values.filter((v): v is number => typeof v === 'number'))?.median ?? null;
const listed = (p: Readonly<Record<string, number>>): string => Object.entries(p).map(([k, v]) => `${k} ${ms(v)}`).join(', ');
/** The RAM tier's bytes for a snapshot (RamTier places every region at a 4 KiB boundary). */
const cacheBytes = (m: Manifest): number => [...m.regions()].reduce((n, { region }) => n + Math.ceil(region.size / 4096) * 4096, 0);

interface Side {
  readonly label: 'A' | 'B';
  readonly name: string;
  readonly model: string;
  readonly seed: number;
  readonly engine: ReferenceEngine;
  readonly client: EngineClient;
  bytes: number;
  regions: number;
  answer: Answer;
  snapshot?: Snapshot;
}

interface SwapRecord {
  row: RowName;
  overlap: Overlap;
  /** The restore's phases that ran concurrently with others (EngineRestoreReport.overlapped). */
  overlapped?: readonly string[];
  warmup: boolean;
  index: number;
  from: 'A' | 'B';
  to: 'A' | 'B';
  /** Seconds from the start of the suspend until the restore resolved. */
  wallSeconds: number;
  suspendSeconds: number;
  suspendPhases: Record<string, number>;
  /** The restore report's seconds. */
  restoreSeconds: number;
  tier: Tier;
  bytes: number;
  phases: Record<string, number>;
  /** bytes / hydrate seconds, where the restore hydrated. */
  hydrateGBps: number | null;
  /** Cold only: the page-cache drop before the swap (not in wallSeconds). */
  dropCachesSeconds?: number;
  /** cuda only, read after the swap: GPU memory the engine put to sleep still holds (nvidia-smi), and how long that spawn took (a fork copying pinned pages shows there). */
  asleepGpuBytes?: number | null;
  spawnSeconds?: number;
}

interface RowResult {
  row: RowName;
  overlap: Overlap;
  label: string;
  skipped: string | null;
  reps: number;
  warmup: number;
  setup: Record<string, number>;
  swaps: SwapRecord[];
  summary: ReturnType<typeof summaryOf> | null;
}

/** How a row swaps: the options of both halves, the tier the restore must come from, what to do first. */
interface SwapMode {
  suspend: EngineSuspendOptions;
  restore: EngineRestoreOptions;
  tier?: Tier | undefined;
  /** The cold row: the page cache dropped before each swap (not timed in it). */
  dropCaches?: boolean;
  /** The engine row: parked keeping its weights, resumed by name; the record keeps no phases. */
  kept?: boolean;
}

const cuda = await cudaStatus();
if (device === 'cuda' && !cuda.available) throw new Error(`--device cuda needs a GPU: ${cuda.reason}`);
const gpu = cuda.available ? (await listDevices())[0] : undefined;
log(`engine swap: two reference engines on ${device} (--layers ${layers} --hidden ${hidden}${device === 'host' ? ': the host model ignores --hidden' : ''}), ${reps} swaps a row, rows ${[...extras, ...rowsToRun].join(', ')}`);

const cleanup: Array<[string, () => unknown]> = [];
const sides: Side[] = [];
const rows: RowResult[] = [];
const capture: Record<string, unknown> = {};
let engineStartSeconds = 0;
let awake = 0; // index into sides of the engine that is awake
let sweep: { rows: SweepRow[]; cacheCreateSeconds: number; ceilingNote: string | null } | null = null;
let vllmLevel1: VllmLevel1Result | null = null;
let ramTierBytes: number | null = null;
/** Raw pinned H2D of the engine's own regions (bench/ceiling.cu), measured before the RAM rows: target 1's "bytes alone". */
let engineCeiling: Ceiling | null = null;
/** Why there is no engineCeiling, where it was tried and failed. */
let engineCeilingNote: string | null = null;
let failure: unknown;

/** One swap of a row: suspend the awake engine, restore the other; checks the tier and the answer. */
async function swap(result: RowResult, index: number, warmup: boolean, mode: SwapMode): Promise<SwapRecord> {
  const { row, overlap } = result;
  const [from, to] = [sides[awake]!, sides[1 - awake]!];
  const kept = mode.kept === true; // the engine row: parked and resumed by name, its record keeps no phases
  let dropCachesSeconds: number | undefined;
  if (mode.dropCaches) {
    const t = performance.now();
    const why = dropCaches();
    if (why !== null) throw new Error(`dropping the page cache failed: ${why}`);
    dropCachesSeconds = since(t);
  }
  const t0 = performance.now();
  let suspended: Awaited<ReturnType<typeof suspendEngine>>;
  let suspendSeconds: number;
  let report: Awaited<ReturnType<typeof restoreEngine>>;
  if (overlap === 'weights' || overlap === 'all') {
    const swapped = await swapEngines({
      suspend: { ...mode.suspend, client: from.client, store, name: from.name },
      restore: { ...mode.restore, source: to.snapshot!, client: to.client, overlapKvWake: true },
      overlap,
    });
    ({ suspend: suspended, restore: report } = swapped);
    suspendSeconds = swapped.phases.suspend!;
  } else {
    suspended = await suspendEngine(store, from.name, from.client, mode.suspend);
    suspendSeconds = since(t0);
    const expected = to.snapshot!.manifest.data.expectedResponse;
    report = kept
      ? await restoreEngine({ store, name: to.name }, to.client, { tiers: { engine: expected ? { expected } : true } })
      : await restoreEngine(to.snapshot!, to.client, { ...mode.restore, ...(overlap === 'kv' ? { overlapKvWake: true } : {}) });
  }
  const wallSeconds = since(t0);
  if (!kept && (suspended.captured || suspended.alreadyAsleep)) throw new Error(`suspend of ${from.label} did not find a durable snapshot or the engine was asleep (captured ${suspended.captured}, alreadyAsleep ${suspended.alreadyAsleep})`);
  awake = 1 - awake;
  if (mode.tier && report.tier !== mode.tier) throw new Error(`[${row}] swap ${index}: ${to.label} restored from the ${report.tier} tier, expected ${mode.tier}`);
  if (row === 'ram2' && !report.multipath?.neighbourUsed) throw new Error(`[ram2] swap ${index}: ${to.label} restored over its own link only, not two: the row would report one link's numbers as two`);
  // After a swap: the woken engine must give the answer it gave before any swap; on cuda, what the one asleep still holds.
  const answer = await askCapital(to.engine.url, PROBE_TOKENS);
  if (!isDeepStrictEqual(answer, to.answer)) throw new Error(`[${row}] swap ${index}: engine ${to.label} answers differently after the swap:\n  before ${JSON.stringify(to.answer)}\n  after  ${JSON.stringify(answer)}`);
  const spawnStart = performance.now();
  const after = device === 'cuda' ? { asleepGpuBytes: gpuBytesOf(from.engine.enginePid), spawnSeconds: since(spawnStart) } : {};
  const hydrate = kept ? undefined : report.phases.hydrate;
  const record: SwapRecord = {
    row, overlap, ...(report.overlapped && !kept ? { overlapped: report.overlapped } : {}), warmup, index, from: from.label, to: to.label,
    wallSeconds, suspendSeconds, suspendPhases: kept ? {} : { ...suspended.phases },
    restoreSeconds: report.seconds, tier: kept ? 'engine' : report.tier, bytes: kept ? 0 : report.bytes, phases: kept ? {} : { ...report.phases },
    hydrateGBps: hydrate ? report.bytes / hydrate / 1e9 : null,
    ...(dropCachesSeconds !== undefined ? { dropCachesSeconds } : {}),
    ...after,
  };
  const where = kept ? `resume ${ms(report.seconds)}` : `${listed(suspended.phases)}; restore ${ms(report.seconds)} from ${report.tier}: ${listed(report.phases)}`;
  log(
    `[${row}${overlap === 'none' ? '' : `, overlap ${overlap}`}]${warmup ? ' warm-up' : ''} swap ${index} ${from.label}->${to.label}: ${ms(wallSeconds)} (suspend ${ms(suspendSeconds)}${kept ? '; ' : ': '}${where})` +
      (after.spawnSeconds !== undefined ? `; then nvidia-smi spawned in ${ms(after.spawnSeconds)}` : ''),
  );
  return record;
}

/** Runs a row's warm-up swaps and measured swaps, then its summary. */
async function runSwaps(result: RowResult, mode: SwapMode): Promise<void> {
  for (let i = 0; i < result.warmup; i++) {
    // Tier 0's first warm-up restores from the store: nothing of the engine woken is held yet.
    result.swaps.push(await swap(result, i, true, i === 0 && result.row === 'tier0' ? { ...mode, tier: undefined } : mode));
  }
  for (let i = 0; i < result.reps; i++) result.swaps.push(await swap(result, i, false, mode));
  result.summary = summaryOf(result.swaps);
}

/**
 * The `engine` row. It starts and ends in the state the other rows expect (one engine awake, the
 * other asleep at level 2): the awake engine is parked keeping its weights (pause, KV cache
 * released) and the asleep one restored from the store; at the end the awake one is suspended as
 * usual and the parked one resumed. Those two transitions are not measured.
 */
async function runKeptSwaps(result: RowResult): Promise<void> {
  const parked = sides[awake]!;
  await suspendEngine(store, parked.name, parked.client, { tiers: { engine: true } });
  await restoreEngine(sides[1 - awake]!.snapshot!, sides[1 - awake]!.client, {});
  awake = 1 - awake;
  try {
    await runSwaps(result, { suspend: { tiers: { engine: true } }, restore: {}, kept: true });
  } finally {
    const last = sides[awake]!;
    const kept = sides[1 - awake]!;
    await suspendEngine(store, last.name, last.client, {});
    await restoreEngine({ store, name: kept.name }, kept.client, { tiers: { engine: true } });
    awake = 1 - awake;
  }
}

/** The medians of a row's measured swaps (its warm-ups left out). */
function summaryOf(swaps: readonly SwapRecord[]) {
  const measured = swaps.filter((s) => !s.warmup);
  const mediansOf = (pick: (s: SwapRecord) => Record<string, number>): Record<string, number> => {
    const keys = new Set(measured.flatMap((s) => Object.keys(pick(s))));
    return Object.fromEntries([...keys].map((k) => [k, medianOf(measured.map((s) => pick(s)[k]))!]));
  };
  return {
    swapSeconds: stats(measured.map((s) => s.wallSeconds)),
    restoreSeconds: stats(measured.map((s) => s.restoreSeconds)),
    suspendSeconds: stats(measured.map((s) => s.suspendSeconds)),
    suspendPhasesMedian: mediansOf((s) => s.suspendPhases),
    phasesMedian: mediansOf((s) => s.phases),
    hydrateGBpsMedian: medianOf(measured.map((s) => s.hydrateGBps)),
    asleepGpuBytesMedian: medianOf(measured.map((s) => s.asleepGpuBytes)),
    tiers: [...new Set(measured.map((s) => s.tier))],
  };
}

/**
 * Target 1's "bytes alone": raw pinned H2D of the engine's own region sizes, in the ceiling
 * program's own process, before the RAM tier pins its memory (it needs as much GPU and pinned
 * memory again). Without the binary, the sweep's layout nearest the engine's region count stands in.
 */
function measureEngineCeiling(): void {
  const sizes = [...sides[0]!.snapshot!.manifest.regions()].map(({ region }) => region.size);
  const t = performance.now();
  try {
    engineCeiling = runCeiling(args.ceiling, sizes, Math.min(reps, 5));
    if (!engineCeiling) engineCeilingNote = `no ceiling binary at ${args.ceiling} (bench/run.sh builds it with nvcc)`;
  } catch (err) {
    engineCeilingNote = `the ceiling program failed: ${(err as Error).message.split('\n')[0]}`;
  }
  log(engineCeiling
    ? `[ram] raw pinned H2D of the engine's ${sizes.length} regions (${gib(engineCeiling.bytes)} GiB): ${engineCeiling.h2dGBps.max} GB/s best, ${engineCeiling.h2dGBps.median} median, ${engineCeiling.pages ?? 'small pages'} (pinned in ${engineCeiling.pinSeconds.toFixed(1)} s; ${since(t).toFixed(1)} s in all)`
    : `[ram] no raw H2D of the engine's regions: ${engineCeilingNote}`);
}

/** vLLM's level-1 sleep and wake of the awake engine, once per run (bench/swap-vllm.ts). */
async function vllmRow(): Promise<void> {
  if (!extras.includes('vllm-l1') || vllmLevel1) return;
  const s = sides[awake]!;
  log(`[vllm-l1] vLLM's level-1 sleep of engine ${s.label} (engine core pid ${s.engine.enginePid}), ${vllmCycles} cycles`);
  vllmLevel1 = await runVllmLevel1(s.engine.url, s.engine.enginePid, vllmCycles, s.answer, () => askCapital(s.engine.url, PROBE_TOKENS), log);
}

/** One row, once per overlap mode (tier0, ram, ram-coded and ram2; the others without overlap). */
async function runRow(row: RowName): Promise<RowResult[]> {
  const modes = OVERLAP_ROWS.includes(row) ? overlaps : (['none'] as const);
  const results: RowResult[] = modes.map((overlap) => ({ row, overlap, label: overlap === 'none' ? LABEL[row] : `${LABEL[row]}, overlap ${overlap}`, skipped: null, reps, warmup: WARMUP, setup: {}, swaps: [], summary: null }));
  const result = results[0]!;
  const skip = (why: string): RowResult[] => {
    result.skipped = why;
    log(`[${row}] skipped: ${why}`);
    return [result];
  };
  const each = async (mode: SwapMode): Promise<void> => {
    for (const r of results) {
      r.setup = { ...result.setup };
      await runSwaps(r, mode);
    }
  };
  log(`[${row}] ${LABEL[row]}${OVERLAP_ROWS.includes(row) ? `, overlap ${modes.join(', ')}` : ''}`);
  if (row === 'engine') {
    const unsupported = engineTierUnsupported();
    if (unsupported) result.skipped = unsupported;
    else await runKeptSwaps(result);
  } else if (row === 'tier0') {
    const resident = new GpuTier();
    try {
      // After the two warm-up swaps, the engine asleep is always held: every measured restore maps its weights back.
      await each({ suspend: { tiers: { gpu: resident } }, restore: { tiers: { gpu: resident } }, tier: 'gpu' });
      result.setup.residentBytesAfterRow = resident.bytes;
    } finally {
      resident.close(); // the engine asleep now restores from the store or the RAM tier in the next rows
    }
  } else if (row === 'ram' || row === 'ram-coded' || row === 'ram2') {
    const gpus = cuda.available ? (await listDevices()).length : 2; // the host backend has a stand-in neighbour
    if (row === 'ram2' && gpus <= neighbour) return skip(`needs GPU ${neighbour} as the neighbour (${gpus} visible)`);
    if (device === 'cuda' && !engineCeiling && !engineCeilingNote) measureEngineCeiling(); // once, before the first RAM tier
    const budgetBytes = sides.reduce((n, s) => n + cacheBytes(s.snapshot!.manifest), 0) + 64 * MiB;
    ramTierBytes = budgetBytes;
    let t = performance.now();
    const cache = await RamTier.create({ budgetBytes, pin: cuda.available, ...(row === 'ram-coded' ? { codec: 'vsnap-c1' as const } : {}) });
    result.setup.cacheCreateSeconds = since(t);
    result.setup.cacheBudgetBytes = budgetBytes;
    try {
      t = performance.now();
      for (const s of sides) await cache.load(store, s.snapshot!.manifest);
      result.setup.cacheLoadSeconds = since(t);
      // What the tier holds for both snapshots (coded: after the load's CPU encode), beside their raw bytes.
      [result.setup.cacheHeldBytes, result.setup.cacheRawBytes] = [cache.usedBytes, budgetBytes - 64 * MiB];
      log(`[${row}] RamTier of ${gib(budgetBytes)} GiB (${cache.pinned ? 'pinned' : 'not pinned'}, codec ${cache.codec}) created in ${ms(result.setup.cacheCreateSeconds)}, both snapshots loaded in ${ms(result.setup.cacheLoadSeconds)}: ${gib(cache.usedBytes)} GiB held of ${gib(result.setup.cacheRawBytes)} raw`);
      await each({ suspend: {}, restore: { tiers: { ram: cache, ...(row === 'ram2' ? { multipath: { neighbour } } : {}) } }, tier: 'ram' });
    } finally {
      cache.close();
    }
  } else if (row === 'pagecache') {
    await runSwaps(result, { suspend: {}, restore: {}, tier: 'store' }); // the warm-up swaps read both snapshots into the page cache
  } else {
    const why = dropCaches();
    if (why !== null) return skip(`cannot drop the page cache: ${why}`);
    result.reps = Math.min(reps, COLD_REPS);
    result.warmup = 0;
    await runSwaps(result, { suspend: {}, restore: { transfer: { directIo: true } }, tier: 'store', dropCaches: true });
  }
  result.summary ??= summaryOf(result.swaps);
  return results;
}

rmSync(args.store, { recursive: true, force: true });
mkdirSync(args.store, { recursive: true });
cleanup.push(['remove the store', () => rmSync(args.store, { recursive: true, force: true })]);
const store = await RegionStore.open(args.store);

try {
  // 0. The transfer-level rows, before any engine holds GPU or pinned memory.
  if (extras.includes('sweep')) {
    log(`[sweep] ${(sweepBytes / GiB).toFixed(2)} GiB in ${sweepCounts.join(', ')} regions, ${reps} restores each`);
    sweep = await runSweep({ device, totalBytes: sweepBytes, counts: sweepCounts, reps: Math.min(reps, 5), ceilingBin: args.ceiling, store, log });
  }
  if (needEngines) {
    // 1. Both engines, started at once; the weights bytes and the probe answer before any swap.
    const t = performance.now();
    const specs = [
      { label: 'A' as const, seed: 1, name: 'swap-a', model: 'vsnap/reference-swap-a' },
      { label: 'B' as const, seed: 2, name: 'swap-b', model: 'vsnap/reference-swap-b' },
    ];
    const started = await Promise.allSettled(
      specs.map((s) => startEngine({ device, seed: s.seed, model: s.model, args: ['--layers', String(layers), '--hidden', String(hidden)], startTimeoutMs: device === 'cuda' ? 400_000 : 20_000 })),
    );
    for (const [i, r] of started.entries()) {
      if (r.status !== 'fulfilled') continue;
      const engine = r.value;
      const client = new EngineClient({ baseUrl: engine.url, token: engine.token });
      cleanup.push([`stop engine ${specs[i]!.label}`, () => engine.stop()], [`close client ${specs[i]!.label}`, () => client.close()]);
      sides.push({ ...specs[i]!, engine, client, bytes: 0, regions: 0, answer: { ids: null, logprobs: null } });
    }
    const failed = started.find((r) => r.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    engineStartSeconds = since(t);
    for (const s of sides) {
      s.answer = await askCapital(s.engine.url, PROBE_TOKENS);
      log(`engine ${s.label} (${s.model}, seed ${s.seed}) at ${s.engine.url}: answer ${JSON.stringify(s.answer.ids)}`);
    }
    log(`both engines up in ${engineStartSeconds.toFixed(1)} s`);
    if (isDeepStrictEqual(sides[0]!.answer, sides[1]!.answer)) throw new Error('engines A and B give the same answer: a swap could not be told from no swap');

    // 2. Both captured, B suspended: A awake, B asleep.
    for (const s of sides) {
      const c = performance.now();
      s.snapshot = await captureEngine(store, s.name, s.client);
      const wall = since(c);
      const tr = s.snapshot.lastCapture!;
      const regions = [...s.snapshot.manifest.regions()];
      s.bytes = regions.reduce((n, { region }) => n + region.size, 0);
      s.regions = regions.length;
      capture[s.label] = { wallSeconds: wall, transferSeconds: tr.seconds, bytes: tr.bytes, GBps: tr.bytesPerSecond / 1e9, dedupedBytes: tr.dedupedBytes ?? 0 };
      log(`captured ${s.label}: ${gib(s.bytes)} GiB in ${s.regions} regions, ${gib(tr.bytes)} GiB moved in ${wall.toFixed(2)} s (transfer ${tr.seconds.toFixed(2)} s, ${(tr.bytesPerSecond / 1e9).toFixed(2)} GB/s)`);
    }
    const b = sides[1]!;
    const suspendB = await suspendEngine(store, b.name, b.client, { captureIfNeeded: true });
    b.snapshot = suspendB.snapshot;
    capture.suspendB = { seconds: suspendB.seconds, captured: suspendB.captured };
    awake = 0;
    log(`suspended B in ${ms(suspendB.seconds)}${suspendB.captured ? ' (it captured again)' : ''}`);

    // 3. The rows; vLLM's level-1 sleep after the RAM tier's (then before the engine row's and the page cache's).
    for (const row of rowsToRun) {
      if (row === 'engine' || row === 'pagecache' || row === 'cold') await vllmRow();
      rows.push(...(await runRow(row)));
    }
    await vllmRow();
  }
} catch (err) {
  failure = err;
} finally {
  for (const [what, fn] of cleanup.reverse()) {
    try {
      await fn();
    } catch (err) {
      log(`cleanup: ${what} failed: ${(err as Error).message}`);
    }
  }
  await releaseIdleResources();
}

// 4. The report.
const bytes = sides[0]?.bytes ?? 0;
/** Per engine row that ran: the medians the tables use. */
const measured = rows.flatMap(({ row, overlap, label, summary: s }) => {
  if (!s) return [];
  const p: PhaseRow = { label, swapMedian: s.swapSeconds?.median ?? null, suspendMedian: s.suspendSeconds?.median ?? null, restoreMedian: s.restoreSeconds?.median ?? null, suspendPhases: s.suspendPhasesMedian, restorePhases: s.phasesMedian, asleepGpuBytes: s.asleepGpuBytesMedian };
  return [{ row, overlap, p }];
});
const phased = measured.map((m) => m.p);
const ramTierEngineBytes = sides[0]?.snapshot ? cacheBytes(sides[0].snapshot.manifest) : null;
const result = {
  date: new Date().toISOString(),
  benchmark: 'engine-swap',
  target: { hotSwapSeconds: 1.0, description: 'hot swap of two 16 GiB engines <= 1.0 s end to end (issue 5)' },
  machine: { device, gpu: gpu?.name ?? null, driverCuda: cuda.available ? cuda.driverVersion : null, cpu: cpus()[0]?.model, cores: cpus().length, node: process.versions.node },
  args: { device, layers, hidden, reps, rows: [...extras, ...rowsToRun], overlap: overlaps, warmup: WARMUP, coldReps: COLD_REPS, probeTokens: PROBE_TOKENS, check: 'the SDK default', sweepRegions: sweepCounts, sweepBytes, vllmCycles, vllmAllocator: process.env.VSNAP_VLLM_SRC ? 'vllm' : 'stand-in' },
  engines: sides.map((s) => ({ label: s.label, name: s.name, model: s.model, seed: s.seed, url: s.engine.url, bytes: s.bytes, regions: s.regions, answer: s.answer })),
  engineStartSeconds,
  capture,
  rows,
  phases: phased,
  targets: null as string | null,
  sweep,
  vllmLevel1,
  ramTierBytes,
  ramTierEngineBytes,
  engineCeiling,
  engineCeilingNote,
  ...(failure ? { error: failure instanceof Error ? (failure.stack ?? failure.message) : String(failure) } : {}),
};

const sizeLabel = bytes >= GiB ? `${gib(bytes)} GiB` : `${(bytes / MiB).toFixed(1)} MiB`;
const on = `${device}${gpu ? `, ${gpu.name}` : ''}`;
/** The engine rows, the median of every phase of their suspends and restores, and how they were measured; empty without engine rows. */
function rowsReport(): string {
  if (rows.length === 0) return '';
  const lines = [
    `| swap of two ${sizeLabel} engines (${on}) | swaps | swap median (s) | swap min | swap max | restore median | suspend median | hydrate (adopt) median | hydrate GB/s | expected response median |`,
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    const s = r.summary;
    if (r.skipped !== null || !s) {
      lines.push(`| ${r.label} | skipped: ${cell(r.skipped ?? 'no result')} | | | | | | | | |`);
      continue;
    }
    const moved = s.phasesMedian.hydrate ?? s.phasesMedian.adoptWeights;
    const movedCell = moved === undefined ? 'n/a' : `${f(moved)}${s.phasesMedian.hydrate === undefined ? ' (adopt)' : ''}`;
    const sw = s.swapSeconds;
    lines.push(`| ${r.label} | ${sw?.n ?? 0} | ${f(sw?.median)} | ${f(sw?.min)} | ${f(sw?.max)} | ${f(s.restoreSeconds?.median)} | ${f(s.suspendSeconds?.median)} | ${movedCell} | ${f(s.hydrateGBpsMedian, 2)} | ${f(s.phasesMedian.expectedResponse)} |`);
  }
  for (const r of rowsToRun.filter((row) => !rows.some((x) => x.row === row && x.overlap === 'none'))) lines.push(`| ${LABEL[r]} | not run: ${failure ? 'an earlier step failed' : 'no result'} | | | | | | | | |`);
  const captureNote = sides.map(({ label }) => {
    const c = capture[label] as { wallSeconds: number; GBps: number } | undefined;
    return `${label} ${c ? `${c.wallSeconds.toFixed(2)} s (${c.GBps.toFixed(2)} GB/s)` : 'n/a'}`;
  });
  lines.push(
    '',
    phaseTable(phased),
    '',
    `Setup: both engines up in ${engineStartSeconds.toFixed(1)} s; capture ${captureNote.join(', ')}.`,
    ...[rows.find((r) => r.row === 'ram-coded' && r.setup.cacheHeldBytes)].flatMap((r) => (r ? [`RAM tier coded: both snapshots held in ${gib(r.setup.cacheHeldBytes!)} GiB for ${gib(r.setup.cacheRawBytes!)} GiB raw (${f(r.setup.cacheHeldBytes! / r.setup.cacheRawBytes!)}x), coded on the CPU when loaded from the store.`] : [])),
    `A swap = suspend of the awake engine + restoreEngine of the other; medians of ${reps} swaps a row (cold: ${COLD_REPS}) after ${WARMUP} unmeasured warm-up swaps (cold: none); every restore gave the answer recorded before any swap.`,
  );
  if (rows.some((r) => r.overlap !== 'none')) {
    lines.push(
      'Overlap modes: none = suspend, then restore; kv = the same, the KV cache woken during the hydrate (overlapKvWake); weights = swapEngines, the suspend and the restore at once, ' +
        "the KV wake waiting for the other engine's sleep (r.awaitRoom, overlapped with the hydrate); all = both at once throughout. A tier-0 restore never overlaps its KV wake with the adopt (both are the engine's own work), so kv is none there. With overlap the suspend and restore medians overlap in time, so they add up to more than the swap.",
    );
  }
  return lines.join('\n');
}
const byRow = (row: RowName): PhaseRow | undefined => phased.find((p) => p.label === LABEL[row]);
/** A row's results per overlap mode, in the order they ran (none first). */
const modeRows = (row: RowName): ModeRow[] => measured.filter((m) => m.row === row).map((m) => ({ overlap: m.overlap, row: m.p }));
const bytesAlone = bytesAloneOf(bytes, sides[0]?.regions ?? 0, engineCeiling, sweep?.rows ?? null);
const targets = targetsTable({
  engineBytes: bytes,
  ram: modeRows('ram'),
  ram2: modeRows('ram2'),
  ramCoded: modeRows('ram-coded'),
  tier0: modeRows('tier0'),
  engine: byRow('engine'),
  bytesAlone,
  sweep: sweep?.rows ?? null,
  vllm: vllmLevel1,
  ramTierEngineBytes: rows.some((r) => r.row === 'ram' && r.summary) ? ramTierEngineBytes : null,
});
result.targets = targets || null;
const table = [
  targets,
  bytesAloneTable(modeRows('ram'), bytesAlone),
  rowsReport(),
  sweep ? sweepTable(sweep.rows, on, sweep.ceilingNote) : '',
  vllmTable(vllmLevel1, byRow('ram'), byRow('tier0'), ramTierBytes, byRow('ram2'), ramTierEngineBytes),
  failure ? `FAILED: ${cell(failure instanceof Error ? failure.message : String(failure))}` : '',
]
  .filter(Boolean)
  .join('\n\n');

if (rows.length > 0 || sweep !== null || vllmLevel1 !== null || failure) {
  mkdirSync(args.out, { recursive: true });
  const size = bytes >= GiB ? `${Math.round(bytes / GiB)}GiB` : `${Math.max(1, Math.round(bytes / MiB))}MiB`;
  const name = sides.length > 0 ? `engine-swap-${size}` : `swap-${extras.join('-') || 'none'}`;
  const base = join(args.out, `${name}${failure ? '-failed' : ''}`);
  writeFileSync(`${base}.json`, `${JSON.stringify(result, null, 2)}\n`);
  writeFileSync(`${base}.md`, `${table}\n`);
  log(`wrote ${base}.json and ${base}.md`);
  console.log(table);
}
if (failure) throw failure;
