// Markdown tables of `npm run bench -- swap` for the rows of issue 14: the phase breakdown per
// swap, the region-count sweep, the two-GPU capture and vLLM's level-1 sleep beside vsnap.
import { type Capture2Result, capture2Target } from './capture-two-gpu.js';
import type { SweepRow } from './swap-sweep.js';
import type { VllmLevel1Result } from './swap-vllm.js';

const GiB = 2 ** 30;
const f = (x: number | null | undefined, digits = 3): string => (x === null || x === undefined || !Number.isFinite(x) ? 'n/a' : x.toFixed(digits));
const msCell = (s: number | undefined): string => (s === undefined ? '' : (s * 1000).toFixed(1));
const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

/** What the phase table needs of an engine row. */
export interface PhaseRow {
  label: string;
  swapMedian: number | null;
  suspendMedian: number | null;
  restoreMedian: number | null;
  suspendPhases: Record<string, number>;
  restorePhases: Record<string, number>;
  /** Median GPU memory the engine put to sleep still held (its engine core, nvidia-smi); null where not measured. */
  asleepGpuBytes?: number | null;
}

/** The flows' own phase names (src/snapshot/engine-flows.ts, phaseTimer laps), in the order they run. */
const SUSPEND_ORDER = ['status', 'check', 'digest', 'capture', 'hold', 'sleep'];
const RESTORE_ORDER = ['sleep', 'wakeWeights', 'export', 'validate', 'map', 'hydrate', 'verifyDigests', 'adoptWeights', 'awaitRoom', 'wakeKvCache', 'wakeKvCacheWait', 'resetPrefixCache', 'expectedResponse'];

function ordered(names: Iterable<string>, order: readonly string[]): string[] {
  const all = [...new Set(names)];
  return [...order.filter((n) => all.includes(n)), ...all.filter((n) => !order.includes(n)).sort()];
}

/** Restore seconds without the expected-response check (the check is the last phase of a restore). */
export const withoutCheck = (restore: number | null, phases: Record<string, number>): number | null =>
  restore === null || phases.expectedResponse === undefined ? null : restore - phases.expectedResponse; // null: the row times no check phase of its own

/** One line per row: the median of every suspend and restore phase, in ms, and what they leave unaccounted. */
export function phaseTable(rows: readonly PhaseRow[]): string {
  if (rows.length === 0) return '';
  const sus = ordered(rows.flatMap((r) => Object.keys(r.suspendPhases)), SUSPEND_ORDER);
  const res = ordered(rows.flatMap((r) => Object.keys(r.restorePhases)), RESTORE_ORDER);
  const head = ['phases, medians in ms', 'swap', 'suspend', ...sus.map((n) => `s.${n}`), 'restore', ...res.map((n) => `r.${n}`), 'restore w/o check'];
  const lines = [`| ${head.join(' | ')} |`, `|---|${head.slice(1).map(() => '---:').join('|')}|`];
  for (const r of rows) {
    lines.push(
      `| ${r.label} | ${msCell(r.swapMedian ?? undefined)} | ${msCell(r.suspendMedian ?? undefined)} | ${sus.map((n) => msCell(r.suspendPhases[n])).join(' | ')} | ` +
        `${msCell(r.restoreMedian ?? undefined)} | ${res.map((n) => msCell(r.restorePhases[n])).join(' | ')} | ${msCell(withoutCheck(r.restoreMedian, r.restorePhases) ?? undefined)} |`,
    );
  }
  lines.push('', 's.* = suspendEngine phases, r.* = restoreEngine phases (each the median over the row\'s measured swaps, so the phases need not add up to the median total exactly).');
  return lines.join('\n');
}

export function sweepTable(rows: readonly SweepRow[], device: string, note: string | null): string {
  if (rows.length === 0) return '';
  const n0 = rows[0]!.regions;
  const lines = [
    `| region-count sweep, RAM-tier restore (${device}) | regions | region size (MiB) | restore median (ms) | GB/s | vs ${n0} regions | raw pinned H2D, same regions (GB/s) | vs raw H2D | export fds (ms) | restore via fds: map set, copy, digest (ms) | vs ${n0} regions | vs raw H2D |`,
    '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  const x = (v: number | null | undefined): string => (v === null || v === undefined ? 'n/a' : `${f(v)}x`);
  for (const r of rows) {
    const mib = (b: number): string => f(b / 2 ** 20, b < 2 ** 20 ? 3 : 1);
    const size = r.minRegionBytes === r.maxRegionBytes ? mib(r.minRegionBytes) : `${mib(r.minRegionBytes)}-${mib(r.maxRegionBytes)}`;
    const im = r.imported;
    lines.push(
      `| ${f(r.bytes / GiB, 2)} GiB | ${r.regions} | ${size} | ${msCell(r.restoreMedianSeconds)} | ${f(r.restoreGBps, 2)} | ${x(r.vsFirst)} | ${f(r.ceiling?.h2dGBps.max, 2)} | ${x(r.vsCeiling)} | ` +
        `${im ? msCell(im.exportSeconds) : 'n/a'} | ${im ? msCell(im.restoreMedianSeconds) : 'n/a'} | ${x(im?.vsFirst)} | ${x(im?.vsCeiling)} |`,
    );
  }
  const worst = Math.max(...rows.map((r) => r.vsFirst ?? 0));
  const worstImported = rows.every((r) => r.imported) ? Math.max(...rows.map((r) => r.imported!.vsFirst ?? 0)) : null;
  lines.push(
    '',
    `Target (issue 14): every count within 10% of the ${n0}-region time; this run: worst ${f(worst)}x mapped (${worst <= 1.1 ? 'met' : 'not met'})` +
      (worstImported === null ? '' : `, ${f(worstImported)}x via fds (${worstImported <= 1.1 ? 'met' : 'not met'})`) +
      `. Snapshot.restore from the pinned RAM tier into one device allocation per region, median of the reps after one warm-up; "via fds" exports each allocation as a POSIX fd, then does what restoreEngine does with an engine's export: one region set over the fds (imported and mapped in restoreEngine's form: pipelined unless VSNAP_REGION_MAPPING says otherwise), the copy and its GPU digest through it, timed from the first import to the verified copy (the engine's export, which the plugin does in the engine process, is timed as the same exports in one process). ` +
      `Not the reference engine: its regions are PyTorch caching-allocator segments, and every request under 10 MiB shares a 20 MiB segment, so 16 GiB in 4,000 own segments (4.2 MiB) cannot be made there.` +
      (note ? ` Ceiling: ${note}.` : ''),
  );
  return lines.join('\n');
}

/** vLLM's level-1 row beside vsnap's RAM-tier and tier-0 restores of the same engines, same run. */
export function vllmTable(v: VllmLevel1Result | null, ram: PhaseRow | undefined, tier0: PhaseRow | undefined, hostCacheBytes: number | null, ram2?: PhaseRow): string {
  if (!v) return '';
  if (v.skipped || !v.summary) return `| vLLM level-1 sleep | skipped: ${cell(v.skipped ?? 'no result')} |\n|---|---|`;
  const s = v.summary;
  const g = (b: number | null | undefined): string => (b === null || b === undefined ? 'n/a' : f(b / GiB, 2));
  const ramNoCheck = ram ? withoutCheck(ram.restoreMedian, ram.restorePhases) : null;
  const lines = [
    '| one 16 GiB-class engine back to serving | sleep / suspend (s) | wake / restore (s) | restore w/o check (s) | vs vLLM level-1 wake | host memory held asleep (GiB) | GPU memory held asleep (GiB) |',
    '|---|---:|---:|---:|---:|---:|---:|',
    `| vLLM level-1 sleep + /wake_up, ${cell(v.allocator)} | first ${f(s.firstSleepSeconds)}, later ${f(s.laterSleepMedianSeconds)} | ${f(s.wakeMedianSeconds)} | ${f(s.wakeMedianSeconds)} | 1.00x | ${g(s.hostHeldBytes)} (own pinned copy, per engine; ${g(s.hostHeldAfterWakeBytes)} still held awake after the last wake) | ${g(s.gpuBytesAsleep)} |`,
  ];
  if (ram) lines.push(`| vsnap RAM tier (suspend + restoreEngine) | ${f(ram.suspendMedian)} | ${f(ram.restoreMedian)} | ${f(ramNoCheck)} | ${ramNoCheck === null ? 'n/a' : `${f(ramNoCheck / s.wakeMedianSeconds)}x`} | ${g(hostCacheBytes)} (one shared, budgeted RAM tier for both engines) | ${g(ram.asleepGpuBytes)} |`);
  if (ram2) {
    const r2 = withoutCheck(ram2.restoreMedian, ram2.restorePhases);
    lines.push(`| vsnap RAM tier over two PCIe links (multipath) | ${f(ram2.suspendMedian)} | ${f(ram2.restoreMedian)} | ${f(r2)} | ${r2 === null ? 'n/a' : `${f(r2 / s.wakeMedianSeconds)}x`} | ${g(hostCacheBytes)} (the same RAM tier) | ${g(ram2.asleepGpuBytes)} |`);
  }
  if (tier0) {
    const t0 = withoutCheck(tier0.restoreMedian, tier0.restorePhases);
    lines.push(`| vsnap tier 0 (weights kept on the GPU) | ${f(tier0.suspendMedian)} | ${f(tier0.restoreMedian)} | ${f(t0)} | ${t0 === null ? 'n/a' : `${f(t0 / s.wakeMedianSeconds)}x`} | 0 | ${g(tier0.asleepGpuBytes)} in the engine, its weights kept by vsnap |`);
  }
  lines.push(
    '',
    `Target (issue 14): vsnap RAM-tier restore without the check <= 0.9x of vLLM's level-1 wake: ${ramNoCheck === null ? 'no RAM row this run' : `${f(ramNoCheck / s.wakeMedianSeconds)}x, ${ramNoCheck / s.wakeMedianSeconds <= 0.9 ? 'met' : 'not met'}`}. ` +
      `vLLM: ${v.cycles.length} cycles of /sleep?level=1 then /wake_up on the awake engine, every wake checked against the probe answer; host memory held = MemAvailable drop while asleep (the engine core's /proc status deltas are in the JSON); GPU = nvidia-smi used_memory of the engine core while asleep.`,
  );
  return lines.join('\n');
}

export interface TargetsInput {
  ram?: PhaseRow | undefined;
  /** The RAM row restored over two PCIe links (multipath), where run. */
  ram2?: PhaseRow | undefined;
  tier0?: PhaseRow | undefined;
  /** The engine's own tier 0 (weights kept in the engine, KV cache released), where run. */
  engine?: PhaseRow | undefined;
  /** Median hydrate GB/s of the RAM row's restores (inside restoreEngine). */
  ramHydrateGBps: number | null;
  /** Raw pinned H2D measured in the same run (the sweep's ceiling), and for how many regions. */
  h2dCeiling: { GBps: number; regions: number } | null;
  engineBytes: number;
  sweep: readonly SweepRow[] | null;
  capture2: Capture2Result | null;
  vllm: VllmLevel1Result | null;
  /** The overlapped rows' swap medians (`--overlap` modes other than none). */
  overlapped?: ReadonlyArray<{ row: 'ram' | 'ram2' | 'tier0'; overlap: string; swapMedian: number }>;
}

/** One row per tier and overlap mode (`--overlap`). */
export interface OverlapRow {
  row: string;
  overlap: string;
  swapMedian: number | null;
  suspendMedian: number | null;
  restoreMedian: number | null;
  wakeKvCache: number | null;
  awaitRoom: number | null;
}

/** Serial vs overlapped swaps, per tier: the swap's median and its ratio to the same tier's `none`. */
export function overlapTable(rows: readonly OverlapRow[]): string {
  if (!rows.some((r) => r.overlap !== 'none')) return '';
  const lines = [
    '| swap overlap | mode | swap median (ms) | vs none | suspend median (ms) | restore median (ms) | r.wakeKvCache (ms) | r.awaitRoom (ms) |',
    '|---|---|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    const base = rows.find((x) => x.row === r.row && x.overlap === 'none')?.swapMedian;
    const ratio = base && r.swapMedian !== null ? `${f(r.swapMedian / base)}x` : 'n/a';
    lines.push(`| ${r.row} | ${r.overlap} | ${msCell(r.swapMedian ?? undefined)} | ${ratio} | ${msCell(r.suspendMedian ?? undefined)} | ${msCell(r.restoreMedian ?? undefined)} | ${msCell(r.wakeKvCache ?? undefined)} | ${msCell(r.awaitRoom ?? undefined)} |`);
  }
  lines.push(
    '',
    'Modes: none = suspend, then restore; kv = the same, the KV cache woken during the hydrate (overlapKvWake); weights = swapEngines, the suspend and the restore at once, ' +
      'the KV wake waiting for the other engine\'s sleep (r.awaitRoom, overlapped with the hydrate); all = both at once throughout. A tier-0 restore never overlaps its KV wake with the adopt (both are the engine\'s own work), so kv is none there. With overlap the suspend and restore medians overlap in time, so they add up to more than the swap.',
  );
  return lines.join('\n');
}

/** The compact summary: each target of issue 14 this run measured, its value, and whether it was met. */
export function targetsTable(t: TargetsInput): string {
  const lines = ['| target (issue 14) | this run | verdict |', '|---|---|---|'];
  const verdict = (ok: boolean): string => (ok ? 'met' : 'not met');
  const small = t.engineBytes > 0 && t.engineBytes < 16 * GiB ? ' (engines under 16 GiB: does not test the target)' : '';
  const wake = t.vllm?.summary?.wakeMedianSeconds;
  const ramNoCheck = t.ram ? withoutCheck(t.ram.restoreMedian, t.ram.restorePhases) : null;
  if (wake && ramNoCheck !== null) {
    lines.push(`| RAM-tier restore without the check <= 0.9x vLLM level-1 wake | ${f(ramNoCheck)} s vs ${f(wake)} s = ${f(ramNoCheck / wake)}x | ${verdict(ramNoCheck / wake <= 0.9)}${small} |`);
  }
  const ram2NoCheck = t.ram2 ? withoutCheck(t.ram2.restoreMedian, t.ram2.restorePhases) : null;
  if (wake && ram2NoCheck !== null) {
    lines.push(`| RAM-tier restore without the check <= 0.9x vLLM level-1 wake, two PCIe links (multipath) | ${f(ram2NoCheck)} s vs ${f(wake)} s = ${f(ram2NoCheck / wake)}x | ${verdict(ram2NoCheck / wake <= 0.9)}${small} |`);
  }
  if (t.ram2?.swapMedian != null) lines.push(`| RAM-tier swap of two engines incl. the check <= 0.5 s median, two PCIe links (multipath) | ${f(t.ram2.swapMedian)} s | ${verdict(t.ram2.swapMedian <= 0.5)}${small} |`);
  if (t.ram?.swapMedian != null) lines.push(`| RAM-tier swap of two engines incl. the check <= 0.5 s median | ${f(t.ram.swapMedian)} s | ${verdict(t.ram.swapMedian <= 0.5)}${small} |`);
  if (t.tier0?.swapMedian != null) lines.push(`| tier-0 swap incl. the check <= 0.1 s median | ${f(t.tier0.swapMedian)} s | ${verdict(t.tier0.swapMedian <= 0.1)}${small} |`);
  if (t.engine?.swapMedian != null) lines.push(`| tier-0 swap incl. the check <= 0.1 s median, the engine's own tier 0 (KV cache released, weights kept in the engine) | ${f(t.engine.swapMedian)} s | ${verdict(t.engine.swapMedian <= 0.1)}${small} |`);
  for (const o of t.overlapped ?? []) {
    const [what, limit] = o.row === 'ram' ? ['RAM-tier', 0.5] : o.row === 'ram2' ? ['RAM-tier (two links)', 0.5] : ['tier-0', 0.1];
    lines.push(`| ${what} swap incl. the check <= ${limit} s median, overlap ${o.overlap} | ${f(o.swapMedian)} s | ${verdict(o.swapMedian <= limit)}${small} |`);
  }
  if (t.ramHydrateGBps !== null && t.h2dCeiling) {
    const r = t.ramHydrateGBps / t.h2dCeiling.GBps;
    lines.push(`| hydrate inside the engine flow >= 0.97x raw H2D, same run | ${f(t.ramHydrateGBps, 2)} / ${f(t.h2dCeiling.GBps, 2)} GB/s (raw, ${t.h2dCeiling.regions} regions) = ${f(r)}x | ${verdict(r >= 0.97)} |`);
  }
  if (t.sweep && t.sweep.length > 1) {
    const worst = Math.max(...t.sweep.map((r) => r.vsFirst ?? 0));
    const im = t.sweep.every((r) => r.imported) ? Math.max(...t.sweep.map((r) => r.imported!.vsFirst ?? 0)) : null;
    const counts = t.sweep.map((r) => r.regions).join(' / ');
    lines.push(`| ${counts} regions restore within 10% of the ${t.sweep[0]!.regions}-region time | worst ${f(worst)}x mapped${im === null ? '' : `, ${f(im)}x via fds`} | ${verdict(Math.max(worst, im ?? 0) <= 1.1)} |`);
  }
  if (t.capture2) {
    const c = t.capture2;
    const { value, met } = capture2Target(c);
    lines.push(`| two-GPU capture into the RAM tier >= 0.9x aggregate D2H | ${value} | ${met === null ? (c.skipped ? '' : 'n/a') : verdict(met)} |`);
  }
  return lines.length > 2 ? lines.join('\n') : '';
}
