import { readFileSync } from 'node:fs';

import { VsnapError } from '../errors.js';
import type { EngineStatus } from '../engine/engine-client.js';
import type { CallOptions } from '../engine/engine-client.js';
import type { EngineClient } from '../engine/engine-client.js';
import { engineControl } from '../engine/control.js';
import { registryCaFile, registryCredentials, type Environment } from '../settings.js';
import type { RegionStore } from '../store/region-store.js';
import { RegistryClient } from './registry.js';
import type { PullCompatibility, PullReport, RegistryOptions, RegistryProgress } from './types.js';

/**
 * Where a snapshot comes from when the store does not have it: an OCI registry reference
 * (`<registry>/<repo>:<tag>` or `@sha256:...`), pulled on first use, then local.
 * @public
 */
export interface RegistrySource {
  /** The reference pushed with {@link RegistryClient.push}. */
  readonly reference: string;
  /** The client (TLS CA, credentials, connections). Default: `new RegistryClient()` (credentials from the Docker config file). */
  readonly registry?: RegistryClient;
  /** Called as bytes arrive. */
  readonly onProgress?: (p: RegistryProgress) => void;
}

/**
 * The facts a pulled snapshot must match, from an engine's status (no GPU query): engine kind
 * and version, the model (its id and revision too, unless a model swap is allowed), the memory
 * kind. Checked from the artifact's config before any layer moves. @internal
 */
export function pullCompatibility(s: EngineStatus, allowModelSwap = false): PullCompatibility {
  const m = s.model;
  return {
    engine: { kind: s.engine.kind, version: s.engine.version },
    model: {
      ...(allowModelSwap ? {} : { id: m.id, revision: m.revision }),
      dtype: m.dtype,
      quantization: m.quantization,
      tensorParallelSize: m.tensorParallelSize,
      pipelineParallelSize: m.pipelineParallelSize,
    },
    platform: { kind: s.ranks[0]?.memory ?? 'cuda' },
  };
}

/**
 * For restoreEngine's {@link SnapshotRef} with `from`: when the store lacks the snapshot (or the
 * capture `id`), pulls it under `name`, checked against the engine's facts before any layer.
 * Nothing goes over the network when the store has it. Returns the pull's report, if one ran. @internal
 */
export async function pullIfMissing(
  source: { store: RegionStore; name: string; id?: string | undefined; from?: RegistrySource | undefined },
  client: EngineClient,
  options: { signal?: AbortSignal | undefined; allowModelSwap?: boolean | undefined },
): Promise<PullReport | undefined> {
  const from = source.from;
  if (!from) return undefined;
  if (await has(source.store, source.name, source.id)) return undefined;
  const call: CallOptions = options.signal ? { signal: options.signal } : {};
  const { status } = await engineControl(client, call);
  return (from.registry ?? new RegistryClient()).pull(source.store, from.reference, {
    name: source.name,
    live: pullCompatibility(status, options.allowModelSwap ?? false),
    ...(options.signal ? { signal: options.signal } : {}),
    ...(from.onProgress ? { onProgress: from.onProgress } : {}),
  });
}

async function has(store: RegionStore, name: string, id: string | undefined): Promise<boolean> {
  if (id === undefined) return (await store.current(name)) !== undefined;
  try {
    await store.get(name, id);
    return true;
  } catch (err) {
    if (err instanceof VsnapError && err.code === 'E_SNAPSHOT_NOT_FOUND') return false;
    throw err;
  }
}

/**
 * Registry client options as the CLI and `vsnap serve` take them from the environment: the CA file
 * `caFile` (else `$VSNAP_REGISTRY_CA`), credentials from `$VSNAP_REGISTRY_USERNAME` and
 * `$VSNAP_REGISTRY_PASSWORD`, else the Docker config file. Throws E_CONFIG for an unreadable CA.
 * @internal
 */
export function registryOptionsFromEnv(env: Environment = process.env, caFile?: string): RegistryOptions {
  const file = caFile ?? registryCaFile(env);
  let ca: string | undefined;
  if (file) {
    try {
      ca = readFileSync(file, 'utf8');
    } catch (err) {
      throw new VsnapError('E_CONFIG', `the registry CA ${file} cannot be read: ${(err as Error).message}`, { path: file });
    }
  }
  const credentials = registryCredentials(env);
  return {
    ...(ca ? { ca } : {}),
    ...(credentials ? { credentials } : {}),
  };
}
