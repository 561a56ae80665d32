import type { Context } from '../context.js';
import { EXIT } from '../context.js';
import { cliMessage } from '../hints.js';
import { formatBytes, formatRate, formatRatio, progressLine } from '../output.js';

/** Aligned columns with a header row. */
function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  return [header, ...rows].map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join('  ')).join('\n');
}

/** vsnap ls [--all]: one row per snapshot, or with --all one per capture. */
export async function ls(ctx: Context): Promise<number> {
  const store = await ctx.openStore('read');
  const list = await store.list();
  if (ctx.options.all) {
    const captures = [];
    for (const s of list) {
      for (const m of await store.history(s.name)) {
        captures.push({ name: s.name, id: m.id, current: m.id === s.id, createdAt: m.data.createdAt, bytes: m.totalBytes, storedBytes: m.storedBytes, regions: m.regionCount, durable: true });
      }
    }
    const human = captures.length
      ? table(['NAME', 'CAPTURE', 'CURRENT', 'CREATED', 'SIZE', 'STORED', 'REGIONS', 'DURABLE'], captures.map((c) => [c.name, c.id, c.current ? 'yes' : '', c.createdAt, formatBytes(c.bytes), `${formatBytes(c.storedBytes)} (${formatRatio(c.storedBytes, c.bytes)})`, String(c.regions), c.durable ? 'yes' : 'no']))
      : `no snapshots in ${ctx.storeRoot}`;
    ctx.print(human, captures);
    return EXIT.ok;
  }
  const human = list.length
    ? table(['NAME', 'CAPTURE', 'CREATED', 'SIZE', 'STORED', 'REGIONS', 'VERSIONS'], list.map((s) => [s.name, s.id, s.createdAt, formatBytes(s.bytes), `${formatBytes(s.storedBytes)} (${formatRatio(s.storedBytes, s.bytes)})`, String(s.regions), String(s.versions)]))
    : `no snapshots in ${ctx.storeRoot}`;
  // entries that are not readable snapshots: on stderr, so the listing itself stays as it was
  for (const p of list.problems) console.error(`vsnap: ${p.name}: [${p.code}] ${p.message}`);
  ctx.print(human, list);
  return EXIT.ok;
}

/** vsnap verify <name> [--id]: re-hash the blobs (never creates or changes the store). */
export async function verify(ctx: Context): Promise<number> {
  const name = ctx.name();
  const store = await ctx.openStore('read');
  const progress = progressLine('verify');
  const found = await store
    .verify(name, { ...(ctx.options.id ? { id: ctx.options.id } : {}), onProgress: progress.update, signal: ctx.signal })
    .finally(() => progress.done());
  const report = { ...found, problems: found.problems.map((p) => ({ ...p, message: cliMessage(p.message, 'verify') })) };
  const human = report.ok
    ? `${report.name} (${report.id}): ok, ${formatBytes(report.bytes)} verified in ${report.seconds.toFixed(2)} s (${formatRate(report.bytes, report.seconds)})`
    : [
        `${report.name} (${report.id}): DAMAGED, ${report.problems.length} problem(s):`,
        ...report.problems.map((p) => `  - rank ${p.rank} ${p.region}: [${p.code}] ${p.message}`),
        `remove it with: vsnap rm ${report.name} --id ${report.id}, then capture again`,
      ].join('\n');
  ctx.print(human, report);
  return report.ok ? EXIT.ok : EXIT.verifyFailed;
}

/** vsnap rm <name> [--id]: remove, then free unreferenced blobs. */
export async function rm(ctx: Context): Promise<number> {
  const name = ctx.name();
  const store = await ctx.openStore('write');
  const removed = await store.remove(name, ctx.options.id ? { id: ctx.options.id } : {});
  const gc = await store.gc();
  ctx.print(`removed ${removed.join(', ')}; freed ${formatBytes(gc.bytesFreed)} in ${gc.blobsRemoved} blob(s)`, { removed, ...gc });
  return EXIT.ok;
}

/** vsnap gc: delete unreferenced blobs. */
export async function gc(ctx: Context): Promise<number> {
  const store = await ctx.openStore('write');
  const result = await store.gc();
  ctx.print(`freed ${formatBytes(result.bytesFreed)} in ${result.blobsRemoved} blob(s)`, result);
  return EXIT.ok;
}
