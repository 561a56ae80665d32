import { invalidArgument, VsnapError } from '../errors.js';
import type { EngineClient, EngineStatus } from '../engine/engine-client.js';
import { engineControl } from '../engine/control.js';
import { exportRegions, type ExportedRegions } from '../engine/export.js';
import type { Mismatch } from '../manifest/compat.js';
import type { RegionStore } from '../store/region-store.js';
import { blobProblems, liveFacts, liveRanks, phaseTimer, preflight, warn } from './checks.js';
import { deepPrecheck, deepSuspendRanks, nativeCheckpointBackend } from './deep.js';
import { checkLive, type LiveCheckReport } from '../digest/compare.js';
import { liveRefs, mapExported } from '../engine/exported.js';
import type { MappedRegions } from '../regions/mapped.js';
import { Snapshot } from '../snapshot/snapshot.js';
import { parkBeforeSleep, type NeighbourParkOptions, type NeighbourParkResult } from '../tiers/neighbour.js';
import type { EngineSuspendOptions, EngineSuspendResult } from './types.js';
import { captureExported } from './capture.js';
/* suspendEngine: an engine to sleep, only once a snapshot can bring its weights back. */

/** Why a snapshot cannot bring back the weights an engine exported, or [] if it can. */
async function restorable(snapshot: Snapshot, status: EngineStatus, exported: ExportedRegions, options: EngineSuspendOptions): Promise<string[]> {
  const mismatches: Mismatch[] = snapshot.manifest.checkCompatibility({ ...liveFacts(status, exported, false), ranks: liveRanks(exported) });
  const problems = [...mismatches.map((m) => m.message), ...blobProblems(snapshot)];
  if (problems.length === 0 && options.verifyBlobs) {
    const report = await snapshot.verify(options.signal ? { signal: options.signal } : {});
    problems.push(...report.problems.map((p) => p.message));
  }
  return problems;
}

/**
 * Whether the store's snapshot `name` could bring this engine's weights back (the check
 * {@link suspendEngine} makes before sleeping), and if not, why.
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

/**
 * Puts an engine to sleep (level 2, freeing its weights) only if this store's snapshot `name`
 * can bring them back: it must match the live layout and engine facts, with every blob
 * present. Otherwise it captures first (`captureIfNeeded`) or refuses with E_NOT_RESTORABLE:
 * weights that cannot come back are never discarded. With `resident`, tier 0 keeps the weights
 * on the GPU and only the KV cache is freed.
 * @public
 */
export async function suspendEngine(
  store: RegionStore,
  name: string,
  client: EngineClient,
  options: EngineSuspendOptions = {},
): Promise<EngineSuspendResult> {
  const started = performance.now();
  const phases: Record<string, number> = {};
  const lap = phaseTimer(phases);
  const call = options.signal ? { signal: options.signal } : {};
  const { control, status } = await engineControl(client, call);
  const current = await store.current(name);
  if (options.deep && options.resident) invalidArgument('options', 'either deep or resident (tier 0 keeps weights on the GPU)', { deep: true, resident: true });
  const backend = options.deep ? (options.checkpointBackend ?? nativeCheckpointBackend()) : undefined;
  // Deep: the API is there and every worker runs, checked before anything changes.
  const deepRanks = backend ? await deepPrecheck(status, backend) : undefined;
  const goDeep = async (): Promise<void> => {
    for (const [step, seconds] of Object.entries(await deepSuspendRanks(deepRanks!, backend!, options.lockTimeoutMs))) phases[`deep.${step}`] = seconds;
  };
  if (status.sleeping) {
    if (!current) throw new VsnapError('E_NOT_RESTORABLE', `the engine is already asleep and the store has no snapshot '${name}'`, { name });
    if (deepRanks) await goDeep();
    return { snapshot: Snapshot.of(store, current), captured: false, alreadyAsleep: true, seconds: (performance.now() - started) / 1000, phases };
  }
  lap('status');
  preflight(status, options.onWarning ? { onWarning: options.onWarning } : (options.capture ?? {}));
  let snapshot = current ? Snapshot.of(store, current) : undefined;
  // One export serves both the restorability check and tier 0's hold (a capture leaves the memory as it is).
  let exported: ExportedRegions | undefined;
  const exportWeights = async (): Promise<ExportedRegions> => (exported ??= await exportRegions(control, status.ranks.length, call));
  // One mapping serves the dirty check and a capture after it; closed before the sleep frees the memory.
  let mapped: MappedRegions | undefined;
  const mapWeights = async (): Promise<MappedRegions> => (mapped ??= await mapExported(await exportWeights()));
  let captured = false;
  let liveCheck: LiveCheckReport | undefined;
  let parked: NeighbourParkResult | undefined;
  let park: NeighbourParkOptions | undefined;
  try {
    const problems = snapshot ? await restorable(snapshot, status, await exportWeights(), options) : [`the store has no snapshot '${name}'`];
    lap('check');
    // The dirty check: layout and blobs match, but do the bytes? Changed regions are captured again.
    if (problems.length === 0 && snapshot) {
      liveCheck = await checkLive(snapshot.manifest, liveRefs(await exportWeights(), await mapWeights()));
      lap('digest');
      if (!liveCheck.checked || liveCheck.changed.length) {
        if (options.onStale === 'refuse') throw staleError(name, liveCheck);
        snapshot = await captureExported(store, name, client, status, await exportWeights(), {
          ...(options.capture ?? {}),
          ...(liveCheck.checked ? { base: snapshot } : {}),
          ...(options.signal ? { signal: options.signal } : {}),
        }, await mapWeights());
        captured = true;
        lap('capture');
      }
    }
    if (problems.length) {
      if (!options.captureIfNeeded) {
        throw new VsnapError(
          'E_NOT_RESTORABLE',
          `refusing to suspend: its weights could not be brought back, so they stay on the GPU.\n${problems.map((p) => `  - ${p}`).join('\n')}\n` +
            'Capture a snapshot first (captureEngine), or pass captureIfNeeded.',
          { name, problems },
        );
      }
      // The weights exported for the check (or now) are captured as they are: no second export.
      snapshot = await captureExported(store, name, client, status, await exportWeights(), {
        ...(options.capture ?? {}),
        ...(options.signal ? { signal: options.signal } : {}),
      }, await mapWeights());
      captured = true;
      lap('capture');
    }
    // Tier 0: keep a reference to every weights region, so the sleep frees only the KV cache.
    if (options.resident) {
      await options.resident.hold(client.baseUrl, snapshot!.id, await exportWeights());
      lap('hold');
    } else if (options.neighbour) {
      park = 'tier' in options.neighbour ? options.neighbour : { tier: options.neighbour };
      parked = await parkBeforeSleep(park, snapshot!.manifest, liveRefs(await exportWeights()), (m) => warn(options, m));
      lap('park');
    }
  } finally {
    exported?.close();
    await mapped?.close();
  }
  try {
    await control.sleep(2, options.mode, call);
    lap('sleep');
  } catch (err) {
    options.resident?.release(client.baseUrl);
    // The engine did not sleep: a copy parked for this suspend would be owned by nobody.
    if (parked && !parked.already) park!.tier.evict(snapshot!.id);
    throw err;
  }
  if (deepRanks) await goDeep();
  return { snapshot: snapshot!, captured, alreadyAsleep: false, seconds: (performance.now() - started) / 1000, phases, ...(liveCheck ? { liveCheck } : {}), ...(parked ? { parked } : {}) };
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

