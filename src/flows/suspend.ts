import { invalidArgument, VsnapError } from '../errors.js';
import type { CallOptions, EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl, type EngineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import { checkDigested, checkLive, uniformDigestChunk, type LiveCheckReport } from '../digest/compare.js';
import { liveRefs, mapExported } from '../engine/exported.js';
import { readTables, type RegionTables } from '../engine/region-table.js';
import type { Mismatch } from '../manifest/compat.js';
import type { Manifest } from '../manifest/manifest.js';
import { checkOptions } from '../options.js';
import type { MappedRegions } from '../regions/mapped.js';
import type { RegionStore } from '../store/region-store.js';
import { Snapshot } from '../snapshot/snapshot.js';
import { keepInEngine } from '../tiers/engine.js';
import { ENGINE_TIER_KEYS, keepingTiers, TIER_KEYS } from '../tiers/index.js';
import type { Kept, SuspendRun } from '../tiers/tier.js';
import { captureExported, checkCaptureOptions } from './capture.js';
import { blobProblems, liveFacts, liveRanks, phaseTimer, preflight, warn } from './checks.js';
import { deepPrecheck, deepSuspendRanks, nativeCheckpointBackend } from './deep.js';
import type { EngineTiers } from '../tiers/index.js';
import type { FlowHooks } from './hooks.js';
import type { EngineCaptureOptions, EngineTierSuspendResult, EngineSuspendOptions, EngineSuspendResult } from './types.js';

/* suspendEngine: an engine to sleep, only once a snapshot (or a tier) can bring its weights back. */

/** Why a snapshot cannot bring back the weights of an engine with these region tables (its export's, or its digest's), or [] if it can. */
async function restorable(snapshot: Snapshot, status: EngineStatus, tables: RegionTables, options: EngineSuspendOptions): Promise<string[]> {
  const mismatches: Mismatch[] = snapshot.manifest.checkCompatibility({ ...liveFacts(status, tables, false), ranks: liveRanks(tables) });
  const problems = [...mismatches.map((m) => m.message), ...blobProblems(snapshot)];
  if (problems.length === 0 && options.verifyBlobs) {
    const report = await snapshot.verify(options.signal ? { signal: options.signal } : {});
    problems.push(...report.problems.map((p) => p.message));
  }
  return problems;
}

/**
 * Whether the store's snapshot `name` could bring this engine's weights back (the check
 * {@link (suspendEngine:1)} makes before sleeping), and if not, why. `cached`: the store has a
 * snapshot `name` (it says nothing of the RAM tier).
 * @public
 */
export async function restorableFor(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: { signal?: AbortSignal } = {},
): Promise<{ restorable: boolean; cached: boolean; problems: string[] }> {
  const call = options.signal ? { signal: options.signal } : {};
  const current = await store.current(name);
  if (!current) return { restorable: false, cached: false, problems: [`the store has no snapshot '${name}'`] };
  const snapshot = Snapshot.of(store, current);
  const { control, status } = await engineControl(client, call);
  if (status.sleeping) {
    // Asleep: the layout cannot be read back; the snapshot must at least be whole.
    const problems = blobProblems(snapshot);
    return { restorable: problems.length === 0, cached: true, problems };
  }
  const exported = await exportRegions(control, status.ranks.length, call);
  try {
    const problems = await restorable(snapshot, status, exported, options);
    return { restorable: problems.length === 0, cached: true, problems };
  } finally {
    exported.close();
  }
}

const SUSPEND_OPTIONS = ['tiers', 'captureIfNeeded', 'verifyBlobs', 'onStale', 'mode', 'deep', 'capture', 'signal', 'onWarning'];

/** The weights of an awake engine, exported and mapped once for the whole suspend (lazily), closed before it sleeps. */
class LiveWeights {
  private exported: ExportedRegions | undefined;
  private mapped: MappedRegions | undefined;
  constructor(
    readonly control: EngineControl,
    private readonly ranks: number,
    private readonly call: CallOptions,
  ) {}
  /** The export (made once); `digestChunkSize` asks the workers for their regions' digests with it (the first call decides). */
  async export(digestChunkSize?: number): Promise<ExportedRegions> {
    return (this.exported ??= await exportRegions(this.control, this.ranks, { ...this.call, ...(digestChunkSize !== undefined ? { digestChunkSize } : {}) }));
  }
  async map(): Promise<MappedRegions> {
    return (this.mapped ??= await mapExported(await this.export()));
  }
  async close(): Promise<void> {
    this.exported?.close();
    await this.mapped?.close();
  }
}

/**
 * Puts an engine to sleep (level 2, freeing its weights) only if this store's snapshot `name`
 * can bring them back: it must match the live layout and engine facts, with every blob
 * present, and the live weights must still equal it (the dirty check). Otherwise it captures
 * first (`captureIfNeeded`; changed weights are always captured again unless `onStale: 'refuse'`)
 * or refuses with E_NOT_RESTORABLE: weights that cannot come back are never discarded. With
 * `tiers`, tier 0 keeps the weights on the GPU (only the KV cache is freed), or a neighbour GPU
 * takes a copy; with `tiers.engine` the engine keeps them itself and no snapshot is needed.
 * @public
 */
export function suspendEngine(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options?: EngineSuspendOptions & { readonly tiers?: Omit<EngineTiers, 'engine'> & { readonly engine?: false } },
): Promise<EngineSuspendResult>;
/**
 * With `tiers.engine`: the engine keeps its weights, and no snapshot is needed.
 * @public
 */
export function suspendEngine(store: RegionStore, name: string, client: EngineClient, options: EngineSuspendOptions): Promise<EngineTierSuspendResult>;
export function suspendEngine(store: RegionStore, name: string, client: EngineClient, options: EngineSuspendOptions = {}): Promise<EngineTierSuspendResult> {
  return suspendEngineWith(store, name, client, options, {});
}

/**
 * {@link (suspendEngine:1)} with the flows' seams (hooks.ts): a swap's wait for the other engine's
 * copy before the sleep, a test's fake checkpoint driver.
 * @internal
 */
export async function suspendEngineWith(store: RegionStore, name: string, client: EngineClient, options: EngineSuspendOptions, hooks: FlowHooks): Promise<EngineTierSuspendResult> {
  checkSuspendOptions(options);
  const started = performance.now();
  const phases: Record<string, number> = {};
  const lap = phaseTimer(phases);
  const call = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  const tiers = options.tiers ?? {};
  const current = await store.current(name);
  const done = (r: Omit<EngineTierSuspendResult, 'seconds' | 'phases'>): EngineTierSuspendResult => ({ ...r, seconds: (performance.now() - started) / 1000, phases });
  if (tiers.engine) {
    const expected = await keepInEngine(client, control, status, tiers.engine === true ? {} : tiers.engine, call);
    lap('releaseKvCache');
    return done({ snapshot: current ? Snapshot.of(store, current) : undefined, tier: 'engine', captured: false, alreadyAsleep: false, ...(expected ? { expected } : {}) });
  }
  const backend = options.deep ? (hooks.checkpoint ?? nativeCheckpointBackend()) : undefined;
  const deepRanks = backend ? await deepPrecheck(status, backend) : undefined; // the API is there and every worker runs, before anything changes
  const goDeep = async (): Promise<void> => {
    const timeout = typeof options.deep === 'object' ? options.deep.lockTimeoutMs : undefined;
    for (const [step, seconds] of Object.entries(await deepSuspendRanks(deepRanks!, backend!, timeout))) phases[`deep.${step}`] = seconds;
  };
  if (status.sleeping) {
    if (!current) throw new VsnapError('E_NOT_RESTORABLE', `the engine is already asleep and the store has no snapshot '${name}'`, { name });
    if (deepRanks) await goDeep();
    return done({ snapshot: Snapshot.of(store, current), captured: false, alreadyAsleep: true });
  }
  lap('status');
  preflight(status, options.onWarning ? { onWarning: options.onWarning } : (options.capture ?? {}));
  const weights = new LiveWeights(control, status.ranks.length, call);
  let checked: Checked;
  let kept: Kept | undefined;
  try {
    checked = await ensureRestorable(store, name, client, status, weights, current, options, lap);
    const run: SuspendRun = { client, snapshot: checked.snapshot, warn: (m) => warn(options, m), lap, exported: () => weights.export() };
    for (const tier of keepingTiers(tiers)) if ((kept = await tier.keep!(run))) break;
  } finally {
    await weights.close();
  }
  try {
    if (hooks.beforeSleep) {
      await hooks.beforeSleep();
      lap('awaitCopy');
    }
    await control.sleep(2, options.mode, call);
    lap('sleep');
  } catch (err) {
    kept?.undo();
    throw err;
  }
  if (deepRanks) await goDeep();
  return done({ ...checked, alreadyAsleep: false, ...(kept ? { tier: kept.tier } : {}), ...(kept?.parked ? { parked: kept.parked } : {}) });
}

function checkSuspendOptions(options: EngineSuspendOptions): void {
  checkOptions('suspendEngine options', options, SUSPEND_OPTIONS);
  checkOptions('suspendEngine options.tiers', options.tiers, TIER_KEYS);
  if (typeof options.tiers?.engine === 'object') checkOptions('suspendEngine options.tiers.engine', options.tiers.engine, ENGINE_TIER_KEYS);
  if (options.capture) checkCaptureOptions(options.capture, 'suspendEngine options.capture');
  const t = options.tiers ?? {};
  if (options.deep && (t.gpu || t.engine)) invalidArgument('options', 'either deep or a tier 0 (tier 0 keeps the weights on the GPU)', { deep: true, tiers: Object.keys(t) });
  if (t.engine && (t.gpu || t.neighbour)) invalidArgument('tiers', 'the engine keeping its weights alone (not with gpu or neighbour)', Object.keys(t));
}

/** The snapshot that brings the weights back, after the checks (and the capture they called for). */
interface Checked {
  readonly snapshot: Snapshot;
  readonly captured: boolean;
  readonly liveCheck?: LiveCheckReport;
}

/**
 * Checks that the store's snapshot matches the engine (layout, facts, blobs) and that the live
 * weights still equal it (the dirty check, by GPU digest); captures when they do not (reading only
 * the changed regions when the layout matched), or refuses. The weights exported and mapped for
 * the checks serve the capture too: no second export.
 */
async function ensureRestorable(
  store: RegionStore,
  name: string,
  client: EngineClient,
  status: EngineStatus,
  weights: LiveWeights,
  current: Manifest | undefined,
  options: EngineSuspendOptions,
  lap: (phase: string) => void,
): Promise<Checked> {
  const snapshot = current ? Snapshot.of(store, current) : undefined;
  const capture = async (base?: Snapshot): Promise<Snapshot> => {
    const ram = options.tiers?.ram;
    const captureOptions: EngineCaptureOptions = { ...(ram ? { ram } : {}), ...(options.capture ?? {}), ...(base ? { base } : {}), ...(options.signal ? { signal: options.signal } : {}) };
    const s = await captureExported(store, name, client, status, await weights.export(), captureOptions, await weights.map());
    lap('capture');
    return s;
  };
  // The engine digests its own weights where it can (one call: its tables and digests; with a tier
  // that keeps the weights, the export it needs carries them); else they are exported and digested here.
  const keeps = keepingTiers(options.tiers ?? {}).length > 0;
  const inEngine = snapshot ? await checkInEngine(snapshot, status, weights, keeps, options, lap) : undefined;
  const problems = inEngine?.problems ?? (snapshot ? await restorable(snapshot, status, await weights.export(), options) : [`the store has no snapshot '${name}'`]);
  if (!inEngine) lap('check');
  if (problems.length === 0) {
    // Layout and blobs match, but do the bytes? Changed regions are captured again.
    const liveCheck = inEngine?.liveCheck ?? (await checkLive(snapshot!.manifest, liveRefs(await weights.export(), await weights.map())));
    if (!inEngine) lap('digest');
    if (liveCheck.checked && liveCheck.changed.length === 0) return { snapshot: snapshot!, captured: false, liveCheck };
    if (options.onStale === 'refuse') throw staleError(name, liveCheck);
    return { snapshot: await capture(liveCheck.checked ? snapshot : undefined), captured: true, liveCheck };
  }
  if (!options.captureIfNeeded) {
    throw new VsnapError(
      'E_NOT_RESTORABLE',
      `refusing to suspend: its weights could not be brought back, so they stay on the GPU.\n${problems.map((p) => `  - ${p}`).join('\n')}\n` +
        'Capture a snapshot first (captureEngine), or pass captureIfNeeded.',
      { name, problems },
    );
  }
  // The weights exported for the check are captured as they are.
  return { snapshot: await capture(), captured: true };
}

/**
 * The checks of a suspend from one call to the engine: its workers send their region tables with
 * the digests of their weights (no export, no mapping here), or, when a tier will keep the
 * weights (`keeps`: it needs their export), the export itself carries the digests (one call for
 * both; a plugin that sends none is asked for them on their own after it). The layout and blobs
 * are checked against the tables (`problems`, as {@link restorable} gives them), and where they
 * match the digests against the snapshot's (`liveCheck`). Undefined where the engine cannot
 * digest: the caller exports the weights instead.
 */
async function checkInEngine(
  snapshot: Snapshot,
  status: EngineStatus,
  weights: LiveWeights,
  keeps: boolean,
  options: EngineSuspendOptions,
  lap: (phase: string) => void,
): Promise<{ problems: string[]; liveCheck?: LiveCheckReport } | undefined> {
  const chunk = uniformDigestChunk(snapshot.manifest);
  if (chunk === undefined || !status.ranks.every((r) => r.digest === true)) return undefined;
  const t0 = performance.now();
  let tables: RegionTables;
  let digested: ReadonlyArray<{ rank: number; regions: ReadonlyArray<{ key: string; digests: readonly string[] }> }> | undefined;
  if (keeps) {
    const exported = await weights.export(chunk);
    if (exported.ranks.every((r) => r.chunkSize === chunk && r.regions.every((x) => x.digests !== undefined))) {
      tables = exported;
      digested = exported.ranks.map((r) => ({ rank: r.rank, regions: r.regions.map((x) => ({ key: x.key, digests: x.digests! })) }));
    } else {
      lap('export'); // an older plugin: its export carries no digests, asked for on their own below
    }
  }
  if (!digested) {
    const answer = await weights.control.digest(chunk, options.signal ? { signal: options.signal } : {});
    tables = { ranks: await readTables(answer, status.ranks.length) };
    digested = answer;
  }
  const seconds = (performance.now() - t0) / 1000;
  lap('digest');
  const problems = await restorable(snapshot, status, tables!, options);
  lap('check');
  return problems.length > 0 ? { problems } : { problems, liveCheck: checkDigested(snapshot.manifest, digested, seconds) };
}

/** E_STALE for a suspend that would discard weights the snapshot does not hold. @internal */
export function staleError(name: string, report: LiveCheckReport): VsnapError {
  const what = report.checked
    ? `the live weights differ from snapshot '${name}' in ${report.changed.length} region(s): ${report.changed.slice(0, 10).join(', ')}${report.changed.length > 10 ? ', ...' : ''}`
    : `snapshot '${name}' has no GPU digests (a version-1 capture), so the live weights cannot be checked against it`;
  return new VsnapError(
    'E_STALE',
    `refusing to suspend: ${what}; discarding them would restore old weights later. ` +
      "Capture again (captureEngine, or leave onStale at its default 'capture'), then suspend.",
    { name, regions: report.changed, checked: report.checked },
  );
}

