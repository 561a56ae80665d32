import { readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';

import { EngineClient, type CallOptions, type CompletionResult, type EngineStatus } from '../../src/engine/engine-client.js';
import { VsnapError } from '../../src/errors.js';

/** The engine routes the flows drive, as the fault injector names them. */
export type Route = 'status' | 'describe' | 'export' | 'sleep' | 'wake' | 'adopt' | 'wakeKv' | 'reset' | 'complete' | 'reload';

/** What a plugin reports it can do, per rank, that older plugins lack: `describe` (its region table while asleep), `digest` (its workers digest their own weights). */
export type PluginAbility = 'describe' | 'digest';

export interface Fault {
  /** Which call (`adopt`: a wake of the weights handing memory over, tier 0's or a filled restore's; `wake`: a wake of the weights; `wakeKv`: of the KV cache). */
  route: Route;
  /** `before`: the engine never sees the call; `after`: it does the work, then the answer is lost. */
  when?: 'before' | 'after';
  /** What happens instead of the answer (default: throw an E_ENGINE_HTTP 500). */
  action?: () => unknown;
  /** How many times it fires (default 1). */
  times?: number;
  /** Run `action` (a delay, say) and let the call go on as usual instead of failing it. */
  pass?: boolean;
}

/**
 * An EngineClient of a real engine with faults injected at chosen calls: the engine itself runs
 * unchanged, only this client's view of a call is broken. Records every call in `calls`.
 */
export class FaultyClient extends EngineClient {
  readonly calls: Route[] = [];
  private faults: Array<Fault & { left: number }> = [];
  private lacking = new Set<PluginAbility>();

  inject(fault: Fault): void {
    this.faults.push({ ...fault, left: fault.times ?? 1 });
  }

  clearFaults(): void {
    this.faults = [];
  }

  /** From now on (until `lack()` with none) its status reads as an older plugin's, without these abilities: the flows take their fallbacks. */
  lack(...abilities: PluginAbility[]): void {
    this.lacking = new Set(abilities);
  }

  private async through<T>(route: Route, real: () => Promise<T>): Promise<T> {
    this.calls.push(route);
    const fire = async (when: 'before' | 'after'): Promise<void> => {
      const f = this.faults.find((x) => x.route === route && (x.when ?? 'before') === when && x.left > 0);
      if (!f) return;
      f.left--;
      if (f.action) await f.action();
      if (f.pass) return;
      throw new VsnapError('E_ENGINE_HTTP', `injected fault: ${route} (${when})`, { status: 500, route });
    };
    await fire('before');
    const out = await real();
    await fire('after');
    return out;
  }

  override vsnapStatus(options?: CallOptions): Promise<EngineStatus> {
    return this.through('status', async () => {
      const status = await super.vsnapStatus(options);
      if (this.lacking.size === 0) return status;
      return { ...status, ranks: status.ranks.map((r) => ({ ...r, ...(this.lacking.has('describe') ? { describe: undefined } : {}), ...(this.lacking.has('digest') ? { digest: undefined } : {}) })) };
    });
  }
  override vsnapDescribe(options?: CallOptions): ReturnType<EngineClient['vsnapDescribe']> {
    return this.through('describe', () => super.vsnapDescribe(options));
  }
  override vsnapExport(args: { socket: string; nonces: readonly string[] }, options?: CallOptions): Promise<Array<{ rank: number; regions: number; bytes: number }>> {
    return this.through('export', () => super.vsnapExport(args, options));
  }
  override vsnapSleep(args: { level: 1 | 2; mode?: 'abort' | 'wait' | 'keep' }, options?: CallOptions): Promise<void> {
    return this.through('sleep', () => super.vsnapSleep(args, options));
  }
  override vsnapWake(args: { tags?: readonly string[]; adopt?: { socket: string; nonces: readonly string[] } } = {}, options?: CallOptions): Promise<void> {
    // the weights' wake names them; the last wake of a restore wakes the KV cache (and any other tag left)
    const route: Route = args.adopt ? 'adopt' : args.tags?.includes('weights') ? 'wake' : 'wakeKv';
    return this.through(route, () => super.vsnapWake(args, options));
  }
  override vsnapResetPrefixCache(options?: CallOptions): Promise<void> {
    return this.through('reset', () => super.vsnapResetPrefixCache(options));
  }
  override vsnapReloadWeights(options?: CallOptions): Promise<void> {
    return this.through('reload', () => super.vsnapReloadWeights(options));
  }
  override completions(body: Parameters<EngineClient['completions']>[0], options?: CallOptions): Promise<CompletionResult> {
    return this.through('complete', () => super.completions(body, options));
  }
}

/** This process's open descriptors other than sockets (connection pools come and go). */
export function openFds(): string[] {
  const out: string[] = [];
  for (const fd of readdirSync('/proc/self/fd')) {
    let target: string;
    try {
      target = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      continue; // the directory's own descriptor, closed by now
    }
    if (!target.startsWith('socket:')) out.push(target);
  }
  return out.sort();
}

/** The memory a filled restore made here for an engine's weights: memfds this process holds (the CPU engine's host memory), by inode. */
export function fillInodes(): Set<number> {
  const inodes = new Set<number>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).includes('memfd:vsnap-fill')) inodes.add(statSync(`/proc/self/fd/${fd}`).ino);
    } catch {
      // closed meanwhile
    }
  }
  return inodes;
}

/** This process's resident set, in bytes. */
export function rssBytes(): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

/** Collects unhandled rejections while `run` runs (and a little after). */
export async function unhandledDuring<T>(run: () => Promise<T>): Promise<{ value?: T; error?: unknown; unhandled: unknown[] }> {
  const unhandled: unknown[] = [];
  const onRejection = (reason: unknown): void => {
    unhandled.push(reason);
  };
  process.on('unhandledRejection', onRejection);
  try {
    const value = await run();
    await new Promise((r) => setTimeout(r, 50));
    return { value, unhandled };
  } catch (error) {
    await new Promise((r) => setTimeout(r, 50));
    return { error, unhandled };
  } finally {
    process.off('unhandledRejection', onRejection);
  }
}
