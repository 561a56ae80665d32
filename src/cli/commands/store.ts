import type { Context } from '../context.js';
import { EXIT } from '../context.js';
import { formatBytes, formatRate, progressLine } from '../output.js';

export async function ls(ctx: Context): Promise<number> {
  const store = await ctx.openStore();
  const list = await store.list();
  const human = list.length
    ? list.map((s) => `${s.name}\t${s.id}\t${s.createdAt}\t${formatBytes(s.bytes)}\t${s.regions} regions\t${s.versions} capture(s)`).join('\n')
    : `no snapshots in ${ctx.storeRoot}`;
  // entries that are not readable snapshots: on stderr, so the listing itself stays as it was
  for (const p of list.problems) console.error(`vsnap: ${p.name}: [${p.code}] ${p.message}`);
  ctx.print(human, list);
  return EXIT.ok;
}

export async function verify(ctx: Context): Promise<number> {
  const name = ctx.name();
  const store = await ctx.openStore();
  const progress = progressLine('verify');
  const report = await store.verify(name, { ...(ctx.options.id ? { id: ctx.options.id } : {}), onProgress: progress.update }).finally(() => progress.done());
  const human = report.ok
    ? `${report.name} (${report.id}): ok, ${formatBytes(report.bytes)} verified in ${report.seconds.toFixed(2)} s (${formatRate(report.bytes, report.seconds)})`
    : [`${report.name} (${report.id}): DAMAGED, ${report.problems.length} problem(s):`, ...report.problems.map((p) => `  - rank ${p.rank} ${p.region}: [${p.code}] ${p.message}`)].join('\n');
  ctx.print(human, report);
  return report.ok ? EXIT.ok : EXIT.verifyFailed;
}

export async function rm(ctx: Context): Promise<number> {
  const name = ctx.name();
  const store = await ctx.openStore();
  const removed = await store.remove(name, ctx.options.id ? { id: ctx.options.id } : {});
  const gc = await store.gc();
  ctx.print(`removed ${removed.join(', ')}; freed ${formatBytes(gc.bytesFreed)} in ${gc.blobsRemoved} blob(s)`, { removed, ...gc });
  return EXIT.ok;
}

export async function gc(ctx: Context): Promise<number> {
  const store = await ctx.openStore();
  const result = await store.gc();
  ctx.print(`freed ${formatBytes(result.bytesFreed)} in ${result.blobsRemoved} blob(s)`, result);
  return EXIT.ok;
}
