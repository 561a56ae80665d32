import { existsSync, statfsSync } from 'node:fs';
import { dirname } from 'node:path';
import { freemem, totalmem } from 'node:os';

import { cudaStatus, formatCudaVersion, listDevices } from '../../gpu/cuda.js';
import { native } from '../../native/index.js';
import { engineUrl } from '../../settings.js';
import { VERSION } from '../../version.js';
import type { EngineClient, EngineStatus } from '../../engine/engine-client.js';
import type { Context } from '../context.js';
import { EXIT } from '../context.js';
import { formatBytes } from '../output.js';
import { checkPlatform, describePlatform } from '../platform.js';

/** vsnap doctor [--engine URL]: CUDA, driver, checkpoint API, devices, RAM, the store, and an engine. */
export async function doctor(ctx: Context): Promise<number> {
  const status = await cudaStatus();
  const devices = status.available ? await listDevices({ freeMemory: true }) : [];
  // Read only: a missing store is reported, never made (the first snapshot, pull or demo makes it).
  let store: Record<string, unknown>;
  const root = ctx.storeRoot;
  if (!existsSync(root)) {
    let parent = dirname(root);
    while (!existsSync(parent) && dirname(parent) !== parent) parent = dirname(parent);
    const fs = statfsSync(parent);
    store = { root, ok: true, exists: false, snapshots: 0, blobs: 0, bytes: 0, freeBytes: fs.bavail * fs.bsize };
  } else {
    try {
      const s = await ctx.openStore('read');
      const usage = await s.usage();
      const fs = statfsSync(root);
      store = { root, ok: true, exists: true, snapshots: (await s.list()).length, ...usage, freeBytes: fs.bavail * fs.bsize };
    } catch (err) {
      store = { root, ok: false, exists: true, error: (err as Error).message };
    }
  }
  let engine: Record<string, unknown> | undefined;
  if (ctx.options.engine || engineUrl()) {
    const client = ctx.engineClient();
    try {
      const s = await client.wire.vsnapStatus();
      engine = { ok: true, url: client.baseUrl, version: s.engine.version, plugin: s.engine.pluginVersion, sleeping: s.sleeping, attentionBackend: s.engine.attentionBackend, ...engineBridge(s) };
    } catch (err) {
      engine = { ok: false, url: client.baseUrl, error: (err as Error).message, ...(await routesWhyNot(client)) };
    } finally {
      await client.close();
    }
  }
  const platform = checkPlatform();
  const report = {
    version: VERSION,
    node: process.versions.node,
    platform,
    checksum: { algorithm: native().checksumAlgorithm, implementation: native().checksumImplementation },
    cuda: status,
    devices,
    memory: { freeBytes: freemem(), totalBytes: totalmem() },
    store,
    ...(engine ? { engine } : {}),
  };
  const lines = [
    `vsnap ${VERSION} on Node ${process.versions.node}`,
    describePlatform(platform),
    `checksums: ${report.checksum.algorithm} (${report.checksum.implementation})`,
    status.available
      ? `cuda: driver supports CUDA ${formatCudaVersion(status.driverVersion)}; checkpoint API ${status.checkpointApi ? `present${status.driverVersion >= 13000 ? ', with GPU pairs (restore onto another GPU)' : ' (restore onto another GPU needs r580+)'}` : 'absent (driver < r570)'}`
      : `cuda: unavailable: ${status.reason}`,
    ...devices.map(
      (d) =>
        `  gpu ${d.ordinal}: ${d.name} (${d.uuid}, cc ${d.computeCapability}), ${formatBytes(d.freeMemory ?? 0)} free of ${formatBytes(d.totalMemory)}, ` +
        `VMM ${d.vmmSupported ? `granularity ${formatBytes(d.vmmGranularity)}` : 'unsupported'}, POSIX-FD handles ${d.posixFdHandlesSupported ? 'yes' : 'no'}`,
    ),
    `host memory: ${formatBytes(freemem())} free of ${formatBytes(totalmem())}`,
    !store.ok
      ? `store: ${root}: ${store.error}`
      : store.exists
        ? `store: ${root}: ${store.snapshots} snapshot(s), ${formatBytes(store.bytes as number)} in ${store.blobs} blob(s), ${formatBytes(store.freeBytes as number)} free`
        : `store: ${root}: none yet (made by the first \`vsnap snapshot\`, \`vsnap pull\` or \`vsnap demo\`), ${formatBytes(store.freeBytes as number)} free there`,
    ...(engine
      ? [
          engine.ok ? `engine: ${engine.url}: vLLM ${engine.version}, plugin ${engine.plugin}, ${engine.sleeping ? 'asleep' : 'awake'}, attention ${engine.attentionBackend}` : `engine: ${engine.url}: ${engine.error}`,
          ...(engine.routes ? [`engine routes: ${describeRoutes(engine.routes as { mechanism: string | null; detail: string })}`] : []),
          ...(engine.bridge ? [`engine bridge: ${engine.bridge as string}`] : []),
          ...(engine.sleepMode ? [`engine sleep mode: ${engine.sleepMode as string}`] : []),
        ]
      : []),
  ];
  ctx.print(lines.join('\n'), report);
  return store.ok && (engine === undefined || engine.ok) ? EXIT.ok : EXIT.failed;
}

/** Route mechanism, bridge support and weights-memory kinds from a plugin status (see engine-client.ts). */
function engineBridge(s: EngineStatus): Record<string, unknown> {
  const problems = s.ranks.filter((r) => r.supported === false).map((r) => `rank ${r.rank}: ${r.unsupportedReason ?? 'unsupported'}`);
  const kinds = s.ranks.map((r) => r.weightsMemory).filter((k) => k !== undefined);
  const memory = kinds.length ? ` (weights memory: ${kinds.map((k) => Object.entries(k!).map(([kind, n]) => `${n} ${kind}`).join(', ')).join('; ')})` : '';
  const noSleepMode = s.ranks.filter((r) => !r.sleepMode);
  const sleepMode = noSleepMode.length
    ? `OFF${noSleepMode.some((r) => r.cumemAllocator) ? ' (--enable-cumem-allocator puts the weights in the cumem pool, but that is not sleep mode)' : ''}: start vLLM with --enable-sleep-mode`
    : 'on';
  return {
    ...(problems.length || noSleepMode.length ? { ok: false } : {}),
    routes: s.routes ?? { mechanism: 'unknown', detail: 'an older plugin that does not say' },
    bridge: problems.length ? `DISABLED: ${problems.join('; ')}` : `ok${memory}`,
    sleepMode,
    frontend: s.ranks[0]?.frontend ?? null,
    releaseKvCache: s.features?.releaseKvCache ?? null,
  };
}

async function routesWhyNot(client: EngineClient): Promise<Record<string, unknown>> {
  try {
    const r = await client.wire.routeMechanism();
    return { routes: { mechanism: r.mechanism, detail: r.detail } };
  } catch {
    return {};
  }
}

function describeRoutes(r: { mechanism: string | null; detail: string }): string {
  return r.mechanism ? `${r.mechanism} (${r.detail})` : `NONE: ${r.detail}`;
}
