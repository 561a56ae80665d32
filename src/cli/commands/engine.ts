import { captureEngine, restoreEngine, suspendEngine } from '../../flows/index.js';
import type { MaterializePolicy } from '../../flows/recovery.js';
import type { Context } from '../context.js';
import { EXIT } from '../context.js';
import { formatBytes, formatRatio, progressLine } from '../output.js';

/** vsnap snapshot <name> --engine URL [--force]: capture a running engine. */
export async function snapshot(ctx: Context): Promise<number> {
  const name = ctx.name();
  const client = ctx.engineClient();
  try {
    const store = await ctx.openStore('create');
    const existing = await store.current(name);
    if (existing && !ctx.options.force) {
      ctx.print(`${name} already has a snapshot (${existing.id}); --force captures again`, { cached: true, id: existing.id });
      return EXIT.ok;
    }
    const progress = progressLine('capture');
    const codec = ctx.options.codec === 'vsnap-c1' ? 'vsnap-c1' : 'off';
    const snap = await captureEngine(store, name, client, { transfer: { onProgress: progress.update }, signal: ctx.signal, codec }).finally(() => progress.done());
    const c = snap.lastCapture!;
    const stored = snap.manifest.storedBytes;
    const coded = stored !== snap.manifest.totalBytes ? `, stored coded in ${formatBytes(stored)} (${formatRatio(stored, snap.manifest.totalBytes)})` : '';
    ctx.print(`captured ${name} (${snap.id}): ${formatBytes(c.bytes)} in ${snap.manifest.regionCount} regions, ${c.seconds.toFixed(2)} s${coded}`, {
      cached: false,
      id: snap.id,
      bytes: c.bytes,
      storedBytes: stored,
      seconds: c.seconds,
    });
    return EXIT.ok;
  } finally {
    await client.close();
  }
}

/** vsnap suspend <name> --engine URL [--capture] [--deep]: sleep the engine if the snapshot can bring it back. */
export async function suspend(ctx: Context): Promise<number> {
  const name = ctx.name();
  const client = ctx.engineClient();
  try {
    const store = await ctx.openStore('create');
    const r = await suspendEngine(store, name, client, { captureIfNeeded: ctx.options.capture === true, deep: ctx.options.deep === true, signal: ctx.signal });
    ctx.print(
      r.alreadyAsleep ? `the engine was already asleep` : `suspended${r.captured ? ' (captured first)' : ''}${ctx.options.deep === true ? ' deep' : ''} in ${r.seconds.toFixed(2)} s; restore with: vsnap restore ${name}`,
      { id: r.snapshot?.id ?? null, captured: r.captured, alreadyAsleep: r.alreadyAsleep, seconds: r.seconds },
    );
    return EXIT.ok;
  } finally {
    await client.close();
  }
}

/** vsnap restore <name> --engine URL [--onto GPU]: bring the weights back and check the expected response. */
export async function restore(ctx: Context): Promise<number> {
  const name = ctx.name();
  const client = ctx.engineClient();
  try {
    const recover = ctx.options.recover === true;
    const materialize = (ctx.options.materialize ?? 'off') as MaterializePolicy;
    // With --recover a new capture may be written: the store is opened for that.
    const store = await ctx.openStore(recover && materialize !== 'off' ? 'create' : 'read');
    // A reference, not an opened snapshot: the restore reads its manifest under the store's lock (no `vsnap rm` in between).
    const source = { store, name, ...(ctx.options.id ? { id: ctx.options.id } : {}) };
    const progress = progressLine('restore');
    const move = typeof ctx.options.onto === 'string' ? { move: { onto: /^\d+$/.test(ctx.options.onto) ? Number(ctx.options.onto) : ctx.options.onto } } : {};
    const report = await restoreEngine(source, client, { transfer: { onProgress: progress.update }, signal: ctx.signal, ...move, ...(recover ? { recovery: { policy: 'reload' as const, materialize } } : {}) }).finally(() =>
      progress.done(),
    );
    const phases = Object.entries(report.phases).map(([k, v]) => `${k} ${(v * 1000).toFixed(1)} ms`).join(', ');
    const r = report.recovery;
    if (!r) {
      const moved = report.gpus ? ` onto ${report.gpus.join(', ')}` : '';
      ctx.print(`restored ${name}${moved}: ${formatBytes(report.bytes)} from the ${report.tier} tier in ${(report.seconds * 1000).toFixed(0)} ms (${phases})`, report);
      return EXIT.ok;
    }
    const outcome = r.materialized ? await r.materialized : undefined;
    const captured = r.snapshot?.id ?? (outcome?.ok ? outcome.snapshot.id : undefined);
    const check = r.expectedResponse === 'matched' ? 'answer checked' : `answer not checked: ${r.uncheckedReason ?? 'nothing to compare with'}`;
    ctx.print(
      `recovered ${name}: its snapshot could not be used (${r.reason}, ${r.code}), so the engine reloaded its weights in ${(report.seconds * 1000).toFixed(0)} ms (${phases}); ${check}` +
        (captured ? `; new snapshot ${captured}` : outcome && !outcome.ok ? `; capturing a new snapshot failed: ${outcome.error.message}` : ''),
      { ...report, recovery: { ...r, snapshot: captured ?? null, materialized: outcome ? outcome.ok : null } },
    );
    return outcome && !outcome.ok ? EXIT.failed : EXIT.ok;
  } finally {
    await client.close();
  }
}

/** vsnap status --engine URL: the engine as its plugin sees it. */
export async function status(ctx: Context): Promise<number> {
  const client = ctx.engineClient();
  try {
    const s = await client.status();
    const lines = [
      `${s.engine.kind} ${s.engine.version} (plugin ${s.engine.pluginVersion ?? 'unknown'}, attention ${s.engine.attentionBackend ?? 'unknown'})`,
      `model ${s.model.id}${s.model.revision ? `@${s.model.revision}` : ''} ${s.model.dtype ?? ''} tp=${s.model.tensorParallelSize} pp=${s.model.pipelineParallelSize}`,
      s.sleeping ? 'asleep' : 'awake',
      ...s.ranks.map((r) => `  rank ${r.rank}: pid ${r.pid}, ${r.device.uuid}, ${r.regions} weights regions, ${formatBytes(r.bytes)}${r.weightsMapped ? '' : ' (asleep)'}`),
    ];
    ctx.print(lines.join('\n'), s);
    return EXIT.ok;
  } finally {
    await client.close();
  }
}
