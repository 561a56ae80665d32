import { readFileSync } from 'node:fs';

import { validateReference } from '../../registry/reference.js';
import { RegistryClient } from '../../registry/registry.js';
import { pullCompatibility } from '../../registry/source.js';
import type { PullCompatibility, RegistryOptions } from '../../registry/types.js';
import { engineUrl, registryCaFile, registryCredentials } from '../../settings.js';
import type { Context } from '../context.js';
import { EXIT, UsageError } from '../context.js';
import { formatBytes, formatRate, progressLine } from '../output.js';

/** The registry client from --ca (or $VSNAP_REGISTRY_CA) and $VSNAP_REGISTRY_USERNAME / $VSNAP_REGISTRY_PASSWORD, else the Docker config. */
function registry(ctx: Context): RegistryClient {
  const caFile = ctx.options.ca ?? registryCaFile();
  let ca: string | undefined;
  if (caFile) {
    try {
      ca = readFileSync(caFile, 'utf8');
    } catch (err) {
      throw new UsageError(`--ca ${caFile}: ${(err as Error).message}`);
    }
  }
  const credentials = registryCredentials();
  const options: RegistryOptions = {
    ...(ca ? { ca } : {}),
    ...(credentials ? { credentials } : {}),
  };
  return new RegistryClient(options);
}

/** A malformed reference is bad usage (exit 2), said before any store or engine is touched. */
function checkReference(ref: string): void {
  const why = validateReference(ref);
  if (why) throw new UsageError(why);
}

/** vsnap push <name> <registry>/<repo>:<tag>: send a snapshot to an OCI registry. */
export async function push(ctx: Context): Promise<number> {
  const name = ctx.name();
  const ref = ctx.args[1];
  if (!ref) throw new UsageError('push needs a reference: vsnap push <name> <registry>/<repo>:<tag>');
  checkReference(ref);
  const store = await ctx.openStore('read');
  const progress = progressLine('push');
  const r = await registry(ctx)
    .push(store, name, ref, { ...(ctx.options.id ? { id: ctx.options.id } : {}), onProgress: progress.update, signal: ctx.signal })
    .finally(() => progress.done());
  ctx.print(
    `pushed ${name} to ${r.reference} (${r.digest}): ${r.layers} layer(s), ${formatBytes(r.bytesUploaded)} sent` +
      `${r.bytesSkipped ? `, ${formatBytes(r.bytesSkipped)} already there` : ''}${r.bytesResumed ? `, ${formatBytes(r.bytesResumed)} resumed` : ''}, ${r.seconds.toFixed(2)} s`,
    r,
  );
  return EXIT.ok;
}

/** vsnap pull <ref> [name] [--engine]: fetch a snapshot into the store, checked against the engine first when given. */
export async function pull(ctx: Context): Promise<number> {
  const ref = ctx.args[0];
  if (!ref) throw new UsageError('pull needs a reference: vsnap pull <registry>/<repo>:<tag> [name]');
  checkReference(ref);
  const name = ctx.args[1];
  let live: PullCompatibility | undefined;
  if (ctx.options.engine ?? engineUrl()) {
    // the engine's facts (kind, version, model, dtype, parallelism) decide before any layer moves
    const client = ctx.engineClient();
    try {
      const s = await client.status({ signal: ctx.signal });
      live = pullCompatibility(s);
    } finally {
      await client.close();
    }
  }
  const store = await ctx.openStore('create');
  const progress = progressLine('pull');
  const r = await registry(ctx)
    .pull(store, ref, { ...(name ? { name } : {}), ...(live ? { live } : {}), onProgress: progress.update, signal: ctx.signal })
    .finally(() => progress.done());
  ctx.print(
    `pulled ${r.name} (${r.id}) from ${ref}: ${formatBytes(r.bytes)}, ${formatBytes(r.bytesDownloaded)} downloaded in ${r.seconds.toFixed(2)} s (${formatRate(r.bytesDownloaded, r.seconds)})` +
      `${r.bytesSkipped ? `, ${formatBytes(r.bytesSkipped)} already in the store` : ''}`,
    r,
  );
  return EXIT.ok;
}
