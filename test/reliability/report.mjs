// Prints the reliability figures the suite recorded (node_modules/.cache/vsnap-reliability/);
// with --docs (or its older name --readme), also writes them into docs/reliability.md between the
// reliability markers (only figures of a full run: `npm run test:reliability`).
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, release, totalmem } from 'node:os';
import { fileURLToPath } from 'node:url';

const dir = fileURLToPath(new URL('../../node_modules/.cache/vsnap-reliability/', import.meta.url));
const target = fileURLToPath(new URL('../../docs/reliability.md', import.meta.url));
const TARGET = 'docs/reliability.md';
const BEGIN = '<!-- reliability:begin -->';
const END = '<!-- reliability:end -->';

let parts = {};
try {
  for (const f of readdirSync(dir).filter((f) => f.endsWith('.json'))) {
    const p = JSON.parse(readFileSync(`${dir}/${f}`, 'utf8'));
    parts[p.part] = p;
  }
} catch {
  parts = {};
}
// every part is produced by `npm test` too (its bounded run of test/reliability)
const want = ['kill', 'enospc', 'manifest-fuzz', 'layouts', 'serve', 'registry-hostile'];
const missing = want.filter((p) => !parts[p]);
if (missing.length) {
  console.error(`reliability: no figures for ${missing.join(', ')} (run the suite first: npm run test:reliability)`);
  process.exit(1);
}
const { kill, enospc, 'manifest-fuzz': fuzz, layouts, serve, 'registry-hostile': hostile } = parts;
const n = (x) => Number(x).toLocaleString('en-US');
const points = (p) =>
  Object.entries(p ?? {})
    .sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${k.replace(/^publish\./, '')} ${v}`)
    .join(', ');
const leakLines = [...(enospc.leaks ?? []), ...(layouts.leaks ?? [])];
const killFds = [kill.publish, kill.capture].filter(Boolean);
const fdsFlat = leakLines.every((l) => l.fdsAfter <= l.fdsBefore) && killFds.every((k) => k.fdsAfter <= k.fdsBefore);
const rssGrowth = Math.max(0, ...leakLines.map((l) => l.rssAfterMiB - l.rssBeforeMiB));
const modes = [...new Set(Object.values(parts).map((p) => p.mode))];
const when = Object.values(parts)
  .map((p) => p.at)
  .sort()
  .pop();
const machine = `${cpus()[0]?.model?.trim() ?? 'unknown CPU'}, ${cpus().length} cores, ${Math.round(totalmem() / 2 ** 30)} GiB RAM, Linux ${release()}, Node ${process.version}`;

const rows = [
  ['Check', 'Cases', 'Result'],
  [
    'kill -9 at a random failpoint of publish (from the end of the transfer to `current`)',
    `${n(kill.publish.trials)} trials, ${n(kill.publish.killed)} killed before the capture resolved (${points(kill.publish.points)})`,
    `**${kill.publish.torn} torn**; ${kill.publish.keptOld} kept the previous snapshot, ${kill.publish.tookNew} the new one`,
  ],
  [
    'kill -9 at a random moment of capture',
    `${n(kill.capture.trials)} trials, ${n(kill.capture.killed)} killed before the capture resolved`,
    `**${kill.capture.torn} torn**; ${kill.capture.keptOld} kept the previous snapshot, ${kill.capture.tookNew} the new one`,
  ],
  [
    `ENOSPC in the middle of a capture (${enospc.method})`,
    `${(enospc.attempts ?? []).length} capture(s)`,
    `every one E_NO_SPACE; previous snapshot current and byte-exact: ${enospc.previousIntact ? 'yes' : 'NO'}; tmp/ empty; a capture afterwards ${enospc.captureAfterwards}`,
  ],
  [
    `Manifest.parse, property-based (fast-check ${fuzz.fastCheck}: valid, mutated, arbitrary, damaged text)`,
    `${n(fuzz.cases)} cases (${n(fuzz.accepted)} accepted, ${n(fuzz.rejected)} rejected)`,
    `**${fuzz.crashes} crashes**, ${fuzz.uncoded} rejections without E_MANIFEST_INVALID and its issues; every acceptance consistent`,
  ],
  [
    'Link and stray-file layouts × store operations (running store and reopened)',
    `${layouts.layouts} layouts × 11 = ${n(layouts.operations)} operations`,
    `**${layouts.raw} raw errors** (${layouts.coded} coded refusals, ${layouts.ok} resolved); ${layouts.outsideChanged} changes outside the store; every link refused (links left in tmp/ by a dead writer: removed as links)`,
  ],
  [
    `\`vsnap serve\`: completions of a good client while ${serve.starvation.attackers} connections hold request bodies open (each declared ${serve.starvation.declaredBytes / 2 ** 20} MiB; 1 byte, or a byte at a time)`,
    `${n(serve.starvation.good)} completions`,
    `**${n(serve.starvation.served)} served** (${Object.entries(serve.starvation.refused ?? {}).map(([k, v]) => `${v} × ${k}`).join(', ') || 'none refused'}); the ${serve.starvation.attackersStillOpen} starving connections still open`,
  ],
  [
    'SIGKILL of `vsnap serve` (booted, or in the middle of its boot), then a restart with the same configuration',
    `${n(serve.restarts.trials)} trials (${serve.restarts.duringBoot} killed during the boot)`,
    `**${serve.restarts.succeeded} restarts served**; **${serve.restarts.leftBehind} engine processes left behind** by the killed serve, ${serve.restarts.leftAfterStop} after the restart's SIGTERM`,
  ],
  [
    `Peak memory (VmHWM growth of a child doing the pull) against a hostile registry: endless or oversized manifest, config, 500 and token bodies; a 200 to every Range request of a ${hostile.layerMiB} MiB layer; ${hostile.chunkMiB} MiB chunks over ${hostile.connections} connections`,
    `${hostile.lines.length} answers: ${hostile.lines.map((l) => `${l.answer} ${l.growthMiB} MiB`).join('; ')}`,
    `**${hostile.lines.filter((l) => l.outcome !== l.expected || l.growthMiB >= l.limitMiB).length} unbounded or wrongly answered**; each refused with its code (or pulled, where legal) under its limit (${[...new Set(hostile.lines.map((l) => l.limitMiB))].join(' / ')} MiB); largest growth ${Math.max(...hostile.lines.map((l) => l.growthMiB))} MiB`,
  ],
  [
    `A pull of ${n(hostile.blobs.count)} distinct blobs under RLIMIT_NOFILE ${hostile.blobs.nofile}`,
    '1 pull',
    `${hostile.blobs.outcome}; at most ${hostile.blobs.peakDescriptors} descriptors open (sampled at every blob request)`,
  ],
  [
    'Descriptors and RSS around the failure tests',
    `${leakLines.length + killFds.length} tests`,
    `descriptors after ≤ before in every one: ${fdsFlat ? 'yes' : 'NO'}; largest RSS growth ${rssGrowth.toFixed(1)} MiB`,
  ],
];
const table = rows.map((r, i) => `| ${r.join(' | ')} |${i === 0 ? `\n|${' --- |'.repeat(r.length)}` : ''}`).join('\n');
const text =
  `Figures of \`npm run test:reliability\` (${modes.join('/')} run, ${when?.slice(0, 16).replace('T', ' ')} UTC, seeds ${kill.seed}/${fuzz.seed}/${serve.seed}) on ${machine}:\n\n` +
  `${table}\n`;

console.log(`\nvsnap reliability figures\n\n${text}`);

if (process.argv.includes('--docs') || process.argv.includes('--readme')) {
  if (modes.length !== 1 || modes[0] !== 'full') {
    console.error(`reliability: not writing ${TARGET}: these figures are not all from a full run (VSNAP_RELIABILITY=full)`);
    process.exit(1);
  }
  const current = readFileSync(target, 'utf8');
  const a = current.indexOf(BEGIN);
  const b = current.indexOf(END);
  if (a < 0 || b < a) {
    console.error(`reliability: ${TARGET} has no ${BEGIN} ... ${END} section`);
    process.exit(1);
  }
  writeFileSync(target, `${current.slice(0, a + BEGIN.length)}\n${text}${current.slice(b)}`);
  console.log(`reliability: ${TARGET} updated`);
}
