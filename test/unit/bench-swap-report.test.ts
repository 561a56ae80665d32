// The report of `npm run bench -- swap`, on synthetic results (no GPU): each of issue 25's targets
// with its value, the ceiling or reference of the same run, the ratio and the verdict; what it says
// where a reference is missing; the RAM-tier restore per phase against the bytes alone; the phase,
// sweep and vLLM tables; the medians and the restore without its check.
import { describe, expect, it } from 'vitest';

import { median } from '../../bench/common.js';
import { bytesAloneOf, bytesAloneTable, type Ceiling, stats, type ModeRow, type PhaseRow, phaseTable, sweepTable, type SweepRow, type TargetsInput, targetsTable, vllmTable, withoutCheck } from '../../bench/swap-report.js';
import type { VllmLevel1Result } from '../../bench/swap-vllm.js';

const GiB = 2 ** 30;
const ENGINE = 16.74 * GiB;

const ceiling = (bytes: number, regions: number, GBps: number): Ceiling => ({ bytes, regions, devices: 1, pinSeconds: 5, h2dGBps: { max: GBps, median: GBps - 0.5 }, d2hGBps: { max: GBps, median: GBps } });

/** A RAM-tier row: the phases add up to `restore`; the check is 90 ms. */
function ram(label: string, swap: number, restore: number, hydrate: number): PhaseRow {
  const check = 0.09;
  const rest = restore - check - hydrate;
  return {
    label,
    swapMedian: swap,
    suspendMedian: swap - restore,
    restoreMedian: restore,
    suspendPhases: { status: 0.01, check: 0.03, sleep: 0.03 },
    restorePhases: { wakeWeights: rest * 0.5, export: rest * 0.2, validate: 0, map: rest * 0.2, hydrate, verifyDigests: rest * 0.1, expectedResponse: check },
  };
}
const tier0 = (swap: number): PhaseRow => ({ label: 'tier 0', swapMedian: swap, suspendMedian: swap / 2, restoreMedian: swap / 2, suspendPhases: {}, restorePhases: { adoptWeights: swap / 4, expectedResponse: swap / 8 } });
const vllm = (wake: number, held: number | null = 22.3 * GiB): VllmLevel1Result => ({
  skipped: null,
  allocator: "vLLM's own",
  cycles: [],
  summary: { firstSleepSeconds: 8.5, laterSleepMedianSeconds: 0.35, wakeMedianSeconds: wake, hostHeldBytes: held, hostHeldAfterWakeBytes: held, gpuBytesAsleep: 0.7 * GiB },
});
function sweepRow(regions: number, mapped: number, viaFds: number | null, bytes = 16 * GiB): SweepRow {
  return {
    regions,
    bytes,
    minRegionBytes: bytes / regions,
    maxRegionBytes: bytes / regions,
    setupSeconds: 0,
    captureSeconds: 0,
    restoreSeconds: [mapped],
    restoreMedianSeconds: mapped,
    restoreGBps: bytes / mapped / 1e9,
    ceiling: ceiling(bytes, regions, 55),
    vsFirst: null,
    vsCeiling: null,
    imported: viaFds === null ? null : { exportSeconds: 0.01, restoreSeconds: [viaFds], restoreMedianSeconds: viaFds, vsFirst: null, vsCeiling: null, phases: { openSeconds: [0.001], copySeconds: [viaFds], issuedToLandedSeconds: [viaFds], digestSeconds: [0] } },
    importedError: viaFds === null ? 'too many open files' : null,
  };
}
/** Engine-sized bytes at 54.4 GB/s: 0.3304 s alone. */
const alone = bytesAloneOf(ENGINE, 252, ceiling(ENGINE, 252, 54.4), null)!;
const base = (over: Partial<TargetsInput> = {}): TargetsInput => ({
  engineBytes: ENGINE,
  ram: [
    { overlap: 'none', row: ram('RAM tier', 0.62, 0.45, 0.335) },
    { overlap: 'all', row: ram('RAM tier, overlap all', 0.44, 0.436, 0.333) },
  ],
  tier0: [
    { overlap: 'none', row: tier0(0.15) },
    { overlap: 'all', row: tier0(0.075) },
  ],
  engine: tier0(0.06),
  bytesAlone: alone,
  sweep: [sweepRow(36, 0.312, 0.321), sweepRow(252, 0.313, 0.33), sweepRow(4000, 0.326, 0.35)],
  vllm: vllm(0.4),
  ramTierEngineBytes: 16.77 * GiB,
  ...over,
});
const line = (table: string, start: string): string => {
  const found = table.split('\n').filter((l) => l.startsWith(`| ${start}`));
  expect(found, `one line starting ${start}`).toHaveLength(1);
  return found[0]!;
};

describe('bench swap report: the targets of issue 25', () => {
  it("takes the bytes alone from the engine's own regions, else from the sweep's nearest layout scaled to the engine", () => {
    expect(alone).toMatchObject({ source: 'engine regions', regions: 252, GBps: 54.4 });
    expect(alone.seconds).toBeCloseTo(ENGINE / 54.4e9, 12);
    const scaled = bytesAloneOf(ENGINE, 252, null, [sweepRow(36, 0.3, 0.3), { ...sweepRow(252, 0.3, 0.3), ceiling: ceiling(16 * GiB, 252, 50) }, sweepRow(4000, 0.3, 0.3)])!;
    expect(scaled).toMatchObject({ source: 'sweep layout', regions: 252, GBps: 50, bytes: ENGINE });
    expect(scaled.seconds).toBeCloseTo(ENGINE / 50e9, 12);
    expect(bytesAloneOf(ENGINE, 252, null, null)).toBeNull();
    expect(bytesAloneOf(ENGINE, 252, null, [{ ...sweepRow(252, 0.3, 0.3), ceiling: null }])).toBeNull(); // host: no ceiling
    expect(bytesAloneOf(0, 0, null, [sweepRow(252, 0.3, 0.3)])).toBeNull();
  });

  it('1: the restore without the check against the bytes alone, per mode, with the ratio and verdict', () => {
    const t = targetsTable(base());
    const serial = line(t, '1. RAM-tier restore without the check <= 1.05x the bytes alone, serial (overlap none)');
    // 0.45 - 0.09 = 0.36 s against 0.3304 s = 1.090x: not met
    expect(serial).toContain('| 0.360 s |');
    expect(serial).toContain("0.330 s: raw pinned H2D 54.40 GB/s, the engine's 252 regions");
    expect(serial).toMatch(/\| 1\.090x \| not met \|$/);
    const all = line(t, '1. RAM-tier restore without the check <= 1.05x the bytes alone, overlap all');
    expect(all).toMatch(/\| 0\.346 s \|.*\| 1\.047x \| met \|$/);
  });

  it('2: against vLLM level-1 wake, and the pinned host memory each holds per sleeping engine', () => {
    const t = targetsTable(base());
    const serial = line(t, "2. RAM-tier restore without the check <= 0.95x vLLM's level-1 /wake_up of the same engine, serial");
    expect(serial).toContain('| 0.360 s (with the check 0.450 s) | vLLM wake 0.400 s');
    expect(serial).toMatch(/\| 0\.900x \| met \|$/);
    const held = line(t, '2. pinned host memory held per sleeping engine');
    expect(held).toContain('vsnap 16.77 GiB');
    expect(held).toContain('vLLM 22.30 GiB');
    expect(held).toMatch(/\| 0\.752x \| reported \|$/);
    const slow = targetsTable(base({ vllm: vllm(0.37) }));
    expect(line(slow, "2. RAM-tier restore without the check <= 0.95x vLLM's level-1 /wake_up of the same engine, serial")).toMatch(/\| 0\.973x \| not met \|$/);
  });

  it('3: the RAM-tier swap per mode, judged as one run of the three the target needs', () => {
    const t = targetsTable(base());
    expect(line(t, '3. RAM-tier swap of two engines incl. the check <= 0.45 s median, serial (overlap none)')).toMatch(/\| 0\.620 s \|.*\| 1\.876x \| not met \|$/);
    expect(line(t, '3. RAM-tier swap of two engines incl. the check <= 0.45 s median, overlap all')).toMatch(/\| 0\.440 s \|.*\| met in this run \(1 of the 3 runs the target needs\) \|$/);
    expect(t).toContain('Target 3 needs three runs out of three: this report judges its own run only');
  });

  it("4: the SDK-held tier-0 swap per mode, beside the engine's own tier 0", () => {
    const t = targetsTable(base());
    expect(line(t, '4. SDK-held tier-0 swap incl. the check <= 0.08 s median, serial')).toMatch(/\| 0\.150 s \| the engine's own tier 0 0\.060 s \| 2\.500x \| not met \|$/);
    expect(line(t, '4. SDK-held tier-0 swap incl. the check <= 0.08 s median, overlap all')).toMatch(/\| 0\.075 s \| .* \| 1\.250x \| met \|$/);
    expect(line(t, "4. the engine's own tier 0 swap")).toMatch(/\| 0\.060 s \| \| \| reference \|$/);
    const noEngine = targetsTable(base({ engine: undefined }));
    expect(line(noEngine, '4. SDK-held tier-0 swap incl. the check <= 0.08 s median, serial')).toMatch(/n\/a: no engine row .* \| n\/a \| not met \|$/);
  });

  it('5: the restore via exported fds, the most regions against the fewest', () => {
    const t = targetsTable(base());
    const fds = line(t, '5. restore via exported fds, 4000 regions <= 1.1x 36');
    expect(fds).toContain('| 350.0 ms (mapped, no fds: 326.0 ms) | 36 regions via fds 321.0 ms | 1.090x | met |');
    const slow = targetsTable(base({ sweep: [sweepRow(36, 0.312, 0.321), sweepRow(4000, 0.326, 1.019)] }));
    expect(line(slow, '5. restore via exported fds')).toMatch(/\| 3\.174x \| not met \|$/);
    const failed = targetsTable(base({ sweep: [sweepRow(36, 0.312, 0.321), sweepRow(4000, 0.326, null)] }));
    expect(line(failed, '5. restore via exported fds')).toMatch(/n\/a: too many open files .*\| n\/a \| n\/a \|$/);
    const host = targetsTable(base({ sweep: [sweepRow(4, 0.01, null, 4 * 2 ** 20), sweepRow(64, 0.01, null, 4 * 2 ** 20)] }));
    expect(line(host, '5. restore via exported fds, 64 regions <= 1.1x 4')).toContain('not tested');
  });

  it('says what is missing instead of judging, and marks engines under 16 GiB', () => {
    const t = targetsTable(base({ bytesAlone: null, vllm: null, sweep: null }));
    expect(line(t, '1. RAM-tier restore without the check <= 1.05x the bytes alone, serial')).toMatch(/n\/a: no raw H2D this run .* \| n\/a \| n\/a \|$/);
    expect(line(t, "2. RAM-tier restore without the check <= 0.95x vLLM's level-1 /wake_up of the same engine, serial")).toMatch(/n\/a: no vllm-l1 row this run \| n\/a \| n\/a \|$/);
    const skipped = targetsTable(base({ vllm: { skipped: 'the engine to measure is asleep', allocator: 'x', cycles: [], summary: null } }));
    expect(skipped).toContain('vllm-l1 skipped: the engine to measure is asleep');
    expect(t).not.toContain('| 5.');
    const small = targetsTable(base({ engineBytes: 0.1 * GiB }));
    expect(line(small, '3. RAM-tier swap of two engines incl. the check <= 0.45 s median, serial')).toContain('(engines under 16 GiB: does not test the target)');
    expect(targetsTable({ engineBytes: 0, ram: [], tier0: [], bytesAlone: null, sweep: null, vllm: null, ramTierEngineBytes: null })).toBe('');
  });

  it('lists the two-link RAM rows under target 3 where they ran', () => {
    const t = targetsTable(base({ ram2: [{ overlap: 'none', row: ram('RAM tier over two PCIe links', 0.4, 0.3, 0.2) }] }));
    expect(line(t, '3. RAM-tier (two PCIe links, multipath) swap of two engines incl. the check <= 0.45 s median, serial')).toContain('| 0.400 s |');
  });

  it("lists the coded RAM rows under issue 48's 0.30 s swap target, judged as one run of three", () => {
    const t = targetsTable(base({ ramCoded: [{ overlap: 'none', row: ram('RAM tier, coded', 0.35, 0.3, 0.2) }, { overlap: 'all', row: ram('RAM tier, coded, overlap all', 0.29, 0.28, 0.2) }] }));
    expect(line(t, 'issue 48: RAM-tier swap of two engines, coded (vsnap-c1) incl. the check <= 0.30 s median, serial')).toMatch(/\| 0\.350 s \|.*\| not met \|$/);
    expect(line(t, 'issue 48: RAM-tier swap of two engines, coded (vsnap-c1) incl. the check <= 0.30 s median, overlap all')).toMatch(/\| 0\.290 s \|.*\| met in this run \(1 of the 3 runs the target needs\) \|$/);
    expect(targetsTable(base())).not.toContain('| issue 48');
  });
});

describe('bench swap report: the RAM-tier restore per phase against the bytes alone', () => {
  const rows: ModeRow[] = base().ram as ModeRow[];

  it('every phase but the check, in ms and as a share of the bytes alone, and what lies outside the copy', () => {
    const t = bytesAloneTable(rows, alone);
    expect(line(t, 'the bytes alone')).toContain('330.4 (1.000x)');
    // serial: hydrate 335 ms = 1.014x of 330.4 ms; outside the copy 360 - 335 = 25 ms = 0.076x
    expect(line(t, 'r.hydrate')).toContain('| 335.0 (1.014x) |');
    expect(line(t, 'r.verifyDigests (waited)')).toContain('| 2.5 (0.008x) |');
    expect(line(t, 'restore without the check')).toContain('| 360.0 (1.090x) | 346.0 (1.047x) |');
    expect(line(t, 'of which outside the copy')).toContain('| 25.0 (0.076x) | 13.0 (0.039x) |');
    expect(t).not.toContain('r.expectedResponse');
    expect(t.split('\n')[0]).toContain('RAM tier, serial (overlap none) | RAM tier, overlap all');
    expect(t).toContain('r.verifyDigests is the digest time the restore waited for after the copy');
    expect(bytesAloneTable(rows, null)).toBe('');
    expect(bytesAloneTable([], alone)).toBe('');
  });
});

describe('bench swap report: the tables beside the targets', () => {
  it('the phase table says verifyDigests holds only the digest time the restore waited for', () => {
    const t = phaseTable([ram('RAM tier', 0.62, 0.45, 0.335)]);
    expect(t).toContain('r.verifyDigests (waited)');
    expect(t).toContain('the GPU digest of the regions holding the first 90% of the bytes runs while the rest is copied');
    expect(phaseTable([tier0(0.1)])).not.toContain('(waited)');
  });

  it("the vLLM table shows the RAM tier's memory per engine and judges issue 25's 0.95x", () => {
    const v = vllmTable(vllm(0.4), ram('RAM tier', 0.62, 0.45, 0.335), undefined, 33.54 * GiB, undefined, 16.77 * GiB);
    expect(v).toContain('16.77 per engine (its snapshot) in 33.54 (one shared, budgeted RAM tier for both engines)');
    expect(v).toContain("Target (issue 25): vsnap RAM-tier restore without the check <= 0.95x of vLLM's level-1 wake of the same engine: 0.900x, met");
  });

  it('the sweep table judges the restore via fds, 4,000 regions against 36', () => {
    const rows = [sweepRow(36, 0.312, 0.321), sweepRow(4000, 0.326, 0.36)].map((r, i, all) => ({ ...r, vsFirst: r.restoreMedianSeconds / all[0]!.restoreMedianSeconds, imported: r.imported && { ...r.imported, vsFirst: r.imported.restoreMedianSeconds / all[0]!.imported!.restoreMedianSeconds } }));
    const t = sweepTable(rows, 'cuda', null);
    expect(t).toContain('Target (issue 25): restore via exported fds of 4,000 regions within 1.1x of 36 (16 GiB); this run: worst 1.121x via fds (not met)');
    // where the via-fds restores spent their time, per count
    expect(t).toContain('Restore via fds, where its time went (medians, ms): 36 regions: the set opened 1.0, the copy 321.0 (its first copy issued to its last byte 321.0), the digest waited for 0.0; 4000 regions:');
  });
});

describe('bench swap report: medians and the restore without its check', () => {
  it('takes the upper median, whatever the order', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([0.4, 0.1, 0.3, 0.2])).toBe(0.3);
  });

  it("gives a row's swaps their count, least, median and most (the swap medians runs are compared on)", () => {
    expect(stats([0.5, 0.3, 0.4])).toEqual({ n: 3, min: 0.3, median: 0.4, max: 0.5 });
    expect(stats([0.4, 0.1, 0.3, 0.2])!.median).toBeCloseTo(0.25, 12); // the mean of the middle two
    expect(stats([])).toBeNull();
  });

  it('puts the phases in flow order and compares the RAM tier without its check to the vLLM wake', () => {
    const r = { label: 'RAM tier', swapMedian: 0.7, suspendMedian: 0.2, restoreMedian: 0.5, suspendPhases: { sleep: 0.1, status: 0.01 }, restorePhases: { expectedResponse: 0.2, hydrate: 0.25, wakeWeights: 0.02 } };
    expect(withoutCheck(r.restoreMedian, r.restorePhases)).toBeCloseTo(0.3, 9);
    expect(withoutCheck(r.restoreMedian, {})).toBeNull(); // a row that times no check of its own
    const t = phaseTable([r]);
    expect(t.indexOf('s.status')).toBeLessThan(t.indexOf('s.sleep'));
    expect(t.indexOf('r.wakeWeights')).toBeLessThan(t.indexOf('r.hydrate'));
    expect(t.indexOf('r.hydrate')).toBeLessThan(t.indexOf('r.expectedResponse'));
    const v = vllmTable({ ...vllm(0.4, 23 * GiB), summary: { ...vllm(0.4, 23 * GiB).summary!, gpuBytesAsleep: null } }, r, undefined, 34 * GiB);
    expect(v).toContain('0.750x'); // 0.3 / 0.4
    expect(v).toMatch(/0\.750x, met/);
    expect(v).toContain('23.00');
  });
});
