import { setTimeout as sleep } from 'node:timers/promises';

import { VsnapError } from '../errors.js';
import type { CallOptions, EngineDigestTable, EngineRegionTable, EngineStatus, QueuedRequestsPolicy } from './types.js';
import type { WireClient } from './wire.js';
import { RUST_FRONTEND_HINT, VsnapDescribeSchema, VsnapDigestSchema, VsnapStatusSchema } from './schemas.js';

/**
 * How the flows drive an engine: through the plugin's authenticated /vsnap/v1 routes, or, where
 * the plugin could not add them (no hook point in that vLLM), through vLLM's dev routes
 * (VLLM_SERVER_DEV_MODE=1) and the plugin's worker methods over /collective_rpc.
 * @internal
 */
export interface EngineControl {
  readonly via: 'vsnap' | 'dev';
  status(call?: CallOptions): Promise<EngineStatus>;
  /** Every rank's weights region table, asleep or awake (plugins whose status says `describe`). */
  describe(call?: CallOptions): Promise<EngineRegionTable[]>;
  /** Every rank's region table with its weights' GPU digests, computed by the workers (plugins whose status says `digest`). */
  digest(chunkSize: number, call?: CallOptions): Promise<EngineDigestTable[]>;
  /** Asks the workers to send their regions and descriptors to `socket`; with `digestChunkSize`, their GPU digests too (plugins whose status says `digest`). */
  exportTo(socket: string, nonces: readonly string[], call?: CallOptions, digestChunkSize?: number): Promise<void>;
  sleep(level: 1 | 2, mode: 'abort' | 'wait' | 'keep' | undefined, call?: CallOptions): Promise<void>;
  wake(tags: readonly string[] | undefined, call?: CallOptions, adopt?: { socket: string; nonces: readonly string[] }): Promise<void>;
  resetPrefixCache(call?: CallOptions): Promise<void>;
  /**
   * The engine's own weight-resident suspend: pause (level 0) and release the KV cache; requests
   * still queued are waited for or aborted (`queued`); after a failure the engine is resumed.
   */
  releaseKvCache(call?: CallOptions, queued?: QueuedRequestsPolicy): Promise<void>;
  /** The workers load their weights again from the checkpoint (vLLM's reload_weights), into woken weights memory. */
  reloadWeights(call?: CallOptions): Promise<void>;
}

function viaRoutes(client: WireClient): EngineControl {
  return {
    via: 'vsnap',
    status: (call) => client.wire.vsnapStatus(call),
    describe: (call) => client.wire.vsnapDescribe(call),
    digest: (chunkSize, call) => client.wire.vsnapDigest({ chunkSize }, call),
    exportTo: async (socket, nonces, call, digestChunkSize) => {
      await client.wire.vsnapExport({ socket, nonces, ...(digestChunkSize !== undefined ? { digestChunkSize } : {}) }, call);
    },
    sleep: (level, mode, call) => client.wire.vsnapSleep({ level, ...(mode ? { mode } : {}) }, call),
    wake: (tags, call, adopt) => client.wire.vsnapWake({ ...(tags ? { tags } : {}), ...(adopt ? { adopt } : {}) }, call),
    resetPrefixCache: (call) => client.wire.vsnapResetPrefixCache(call),
    releaseKvCache: (call, queued) => client.wire.vsnapReleaseKvCache(call, { queued: queued ?? 'wait' }),
    reloadWeights: (call) => client.wire.vsnapReloadWeights(call),
  };
}

function viaDevRoutes(client: WireClient): EngineControl {
  return {
    via: 'dev',
    status: async (call) => {
      const ranks = (await client.wire.collectiveRpc('vsnap_status', {}, call)) ?? [];
      const first = (ranks[0] ?? {}) as { engine?: unknown; model?: unknown };
      const routes = { mechanism: null, detail: 'no /vsnap/v1 routes on this engine: driven through the dev routes (vsnap doctor --engine URL says why)' };
      const parsed = VsnapStatusSchema.safeParse({ engine: first.engine, model: first.model, sleeping: await client.wire.isSleeping(call), routes, ranks });
      if (!parsed.success) {
        throw new VsnapError('E_ENGINE_PROTOCOL', `the workers' vsnap_status has an unexpected shape: is the vsnap plugin of a matching version loaded?`, {
          issues: parsed.error.issues,
        });
      }
      return parsed.data;
    },
    describe: async (call) => {
      const parsed = VsnapDescribeSchema.safeParse({ ranks: (await client.wire.collectiveRpc('vsnap_describe', {}, call)) ?? [] });
      if (!parsed.success) {
        throw new VsnapError('E_ENGINE_PROTOCOL', `the workers' vsnap_describe has an unexpected shape: is the vsnap plugin of a matching version loaded?`, { issues: parsed.error.issues });
      }
      return parsed.data.ranks;
    },
    digest: async (chunkSize, call) => {
      const parsed = VsnapDigestSchema.safeParse({ ranks: (await client.wire.collectiveRpc('vsnap_digest', { args: [chunkSize] }, call)) ?? [] });
      if (!parsed.success) {
        throw new VsnapError('E_ENGINE_PROTOCOL', `the workers' vsnap_digest has an unexpected shape: is the vsnap plugin of a matching version loaded?`, { issues: parsed.error.issues });
      }
      return parsed.data.ranks;
    },
    exportTo: async (socket, nonces, call, digestChunkSize) => {
      await client.wire.collectiveRpc('vsnap_export', { args: digestChunkSize !== undefined ? [socket, [...nonces], digestChunkSize] : [socket, [...nonces]] }, call);
    },
    sleep: (level, mode, call) => client.wire.sleep({ level, ...(mode ? { mode } : {}) }, call),
    wake: async (tags, call, adopt) => {
      if (adopt) await client.wire.collectiveRpc('vsnap_adopt', { args: [adopt.socket, [...adopt.nonces]] }, call);
      await client.wire.wakeUp(tags ? { tags } : {}, call);
    },
    resetPrefixCache: (call) => client.wire.resetPrefixCache(call),
    releaseKvCache: (call, queued) => releaseThroughDevRoutes(client, call, queued ?? 'wait'),
    reloadWeights: async (call) => {
      await client.wire.collectiveRpc('reload_weights', {}, call);
    },
  };
}

/** How many times a release is tried while requests stay queued (the plugin's RELEASE_ATTEMPTS). */
const RELEASE_ATTEMPTS = 8;

/**
 * The plugin's release policy, through the dev routes: vLLM's `release_kv_cache_memory` refuses
 * while any request is queued or running (vllm/v1/engine/core.py), and a pause of mode `keep`
 * keeps them. `wait` pauses with mode `wait`, and while requests stay queued resumes the engine
 * (they are admitted), waits and tries again; `abort` pauses with mode `abort`. After a failure
 * the engine is resumed (`wake_up` of `scheduling`), never left paused.
 */
async function releaseThroughDevRoutes(client: WireClient, call: CallOptions | undefined, queued: QueuedRequestsPolicy): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    await client.wire.sleep({ level: 0, mode: queued }, call);
    try {
      await client.wire.releaseKvCacheMemory(call);
      return;
    } catch (err) {
      await client.wire.wakeUp({ tags: ['scheduling'] }, call).catch(() => undefined);
      const busy = err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && /completed pause/.test(String(err.details.body));
      if (!busy) throw err;
      if (queued === 'abort' || attempt >= RELEASE_ATTEMPTS) {
        throw new VsnapError(
          'E_ENGINE_STATE',
          `${client.baseUrl} still had requests queued after ${attempt} attempt(s) to release its KV cache; it was resumed. Retry when it is idle, or release with queued: 'abort'`,
          { url: client.baseUrl, attempts: attempt },
          { cause: err },
        );
      }
    }
    await sleep(Math.min(50 * 2 ** (attempt - 1), 1000));
  }
}

/**
 * Picks how to drive `client`: the vsnap routes when the plugin answers on them, else the dev
 * routes; refuses clearly when there is neither.
 * @internal
 */
export async function engineControl(client: WireClient, call?: CallOptions): Promise<{ control: EngineControl; status: EngineStatus }> {
  try {
    const control = viaRoutes(client);
    return { control, status: await control.status(call) };
  } catch (err) {
    if (!(err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && err.details.status === 404)) throw err;
  }
  try {
    const control = viaDevRoutes(client);
    return { control, status: await control.status(call) };
  } catch (err) {
    if (err instanceof VsnapError && err.code === 'E_ENGINE_HTTP' && err.details.status === 404) {
      throw new VsnapError(
        'E_ENGINE_STATE',
        `${client.baseUrl} has neither the vsnap routes nor vLLM's dev routes: load the plugin (VLLM_PLUGINS=vsnap, VSNAP_TOKEN=...) ` +
          `or start the engine with VLLM_SERVER_DEV_MODE=1. ${RUST_FRONTEND_HINT}`,
        { url: client.baseUrl },
        { cause: err },
      );
    }
    throw err;
  }
}
