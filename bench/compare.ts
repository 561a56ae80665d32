// Two runs of `npm run bench -- swap` side by side: every median both JSON files hold (per row: the
// swap, the suspend, the restore, the restore without its check, the hydrate; per sweep count: the
// restore and the restore through exported fds; vLLM's level-1 wake, a reference), with the ratio
// after / before and the medians more than `tolerance` slower marked.
//   node dist-gpu/bench-compare.mjs <before.json> <after.json> [tolerance, default 0.03]
import { readFileSync } from 'node:fs';

import { type Stats, type SweepRow, withoutCheck } from './swap-report.js';

/** What of an engine-swap JSON the comparison reads. */
export interface SwapRun {
  rows: Array<{ label: string; summary: { swapSeconds: Stats | null; suspendSeconds: Stats | null; restoreSeconds: Stats | null; phasesMedian: Record<string, number> } | null }>;
  sweep: { rows: SweepRow[] } | null;
  vllmLevel1: { summary: { wakeMedianSeconds: number } | null } | null;
}

/** Every median of `before` that `after` has too, in seconds: [name, before, after, whether a reference]. */
function pairs(before: SwapRun, after: SwapRun): Array<[string, number, number, boolean]> {
  const out: Array<[string, number, number, boolean]> = [];
  const add = (name: string, b: number | null | undefined, a: number | null | undefined, reference = false): void => {
    if (typeof b === 'number' && typeof a === 'number') out.push([name, b, a, reference]);
  };
  for (const b of before.rows) {
    const a = after.rows.find((r) => r.label === b.label);
    if (!b.summary || !a?.summary) continue;
    add(`${b.label}: swap`, b.summary.swapSeconds?.median, a.summary.swapSeconds?.median);
    add(`${b.label}: suspend`, b.summary.suspendSeconds?.median, a.summary.suspendSeconds?.median);
    add(`${b.label}: restore`, b.summary.restoreSeconds?.median, a.summary.restoreSeconds?.median);
    const noCheck = (s: typeof b.summary): number | null => withoutCheck(s.restoreSeconds?.median ?? null, s.phasesMedian);
    add(`${b.label}: restore without the check`, noCheck(b.summary), noCheck(a.summary));
    add(`${b.label}: r.hydrate`, b.summary.phasesMedian.hydrate, a.summary.phasesMedian.hydrate);
  }
  for (const b of before.sweep?.rows ?? []) {
    const a = after.sweep?.rows.find((r) => r.regions === b.regions);
    add(`sweep, ${b.regions} regions: restore`, b.restoreMedianSeconds, a?.restoreMedianSeconds);
    add(`sweep, ${b.regions} regions: restore via fds`, b.imported?.restoreMedianSeconds, a?.imported?.restoreMedianSeconds);
  }
  add("vLLM's level-1 wake (reference)", before.vllmLevel1?.summary?.wakeMedianSeconds, after.vllmLevel1?.summary?.wakeMedianSeconds, true);
  return out;
}

/** Rows measured in one run and not the other (a row renamed between the trees is not compared: say so). */
function unmatched(before: SwapRun, after: SwapRun): string[] {
  const measured = (r: SwapRun): string[] => r.rows.filter((x) => x.summary).map((x) => x.label);
  const [b, a] = [measured(before), measured(after)];
  return [...b.filter((l) => !a.includes(l)).map((l) => `${l} (before only)`), ...a.filter((l) => !b.includes(l)).map((l) => `${l} (after only)`)];
}

/** The comparison as a markdown table, and the vsnap medians more than `tolerance` slower after than before. */
export function compareRuns(before: SwapRun, after: SwapRun, tolerance = 0.03): { table: string; slower: string[] } {
  const lines = ['| median | before (ms) | after (ms) | after / before |', '|---|---:|---:|---:|'];
  const slower: string[] = [];
  for (const [name, b, a, reference] of pairs(before, after)) {
    const ratio = a / b;
    const over = !reference && ratio > 1 + tolerance;
    if (over) slower.push(name);
    lines.push(`| ${name} | ${(b * 1000).toFixed(1)} | ${(a * 1000).toFixed(1)} | ${ratio.toFixed(3)}x${over ? ` (more than ${(tolerance * 100).toFixed(0)}% slower)` : ''} |`);
  }
  const alone = unmatched(before, after);
  if (alone.length) lines.push('', `not compared, measured in one run only: ${alone.join('; ')}`);
  lines.push('', slower.length ? `${slower.length} median(s) more than ${(tolerance * 100).toFixed(0)}% slower: ${slower.join('; ')}` : `no median more than ${(tolerance * 100).toFixed(0)}% slower`);
  return { table: lines.join('\n'), slower };
}

if (/(bench-)?compare\.(ts|mjs)$/.test(process.argv[1] ?? '')) {
  const [beforeFile, afterFile, tolerance = '0.03'] = process.argv.slice(2);
  if (!beforeFile || !afterFile) throw new Error('usage: bench-compare <before.json> <after.json> [tolerance]');
  const read = (f: string): SwapRun => JSON.parse(readFileSync(f, 'utf8')) as SwapRun;
  console.log(compareRuns(read(beforeFile), read(afterFile), Number(tolerance)).table);
}
