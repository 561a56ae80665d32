import { readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';

import { EngineClient, type CallOptions, type CompletionResult, type EngineClientOptions, type EngineDigestTable, type EngineStatus } from '../../src/engine/engine-client.js';
import { EngineWire } from '../../src/engine/wire.js';
import { VsnapError } from '../../src/errors.js';

/** The engine routes the flows drive, as the fault injector names them. */
export type Route = 'status' | 'describe' | 'digest' | 'export' | 'sleep' | 'wake' | 'adopt' | 'wakeKv' | 'reset' | 'complete' | 'reload';

/**
 * What a plugin reports it can do, per rank, that older plugins lack: `describe` (its region table
 * while asleep), `digest` (its workers digest their own weights); `exportDigests`: its export
 * reads socket and nonces only, so it sends no digests with the regions.
 */
export type PluginAbility = 'describe' | 'digest' | 'exportDigests';

export interface Fault {
  /** Which call (`adopt`: a wake of the weights handing memory over, tier 0's or a filled restore's; `wake`: a wake of the weights; `wakeKv`: of the KV cache). */
  route: Route;
  /** `before`: the engine never sees the call; `after`: it does the work, then the answer is lost. */
  when?: 'before' | 'after';
  /** What happens instead of the answer (default: throw an E_ENGINE_HTTP 500); an error it throws is the call's. */
  action?: () => unknown;
  /** How many times it fires (default 1). */
  times?: number;
  /** Run `action` (a delay, say) and let the call go on as usual instead of failing it. */
  pass?: boolean;
  /** With `pass` and `when: 'after'`: the answer the caller gets instead of the engine's. */
  rewrite?: (answer: never) => unknown;
}

/** One call the flows made, with what they sent. */
export interface LoggedCall {
  route: Route;
  /** The call's arguments as the flows passed them (an export's socket, nonces and digestChunkSize, say). */
  args?: unknown;
}

/** The wire of a {@link FaultyClient}: each route goes through the injected faults and the call log. */
export class FaultyWire extends EngineWire {
  readonly calls: Route[] = [];
  readonly log: LoggedCall[] = [];
  private faults: Array<Fault & { left: number }> = [];
  lacking = new Set<PluginAbility>();

  inject(fault: Fault): void {
    this.faults.push({ ...fault, left: fault.times ?? 1 });
  }

  clearFaults(): void {
    this.faults = [];
  }

  async through<T>(route: Route, real: () => Promise<T>, args?: unknown): Promise<T> {
    this.calls.push(route);
    this.log.push(args === undefined ? { route } : { route, args });
    const fire = async (when: 'before' | 'after'): Promise<Fault | undefined> => {
      const f = this.faults.find((x) => x.route === route && (x.when ?? 'before') === when && x.left > 0);
      if (!f) return undefined;
      f.left--;
      if (f.action) await f.action();
      if (f.pass) return f;
      throw new VsnapError('E_ENGINE_HTTP', `injected fault: ${route} (${when})`, { status: 500, route });
    };
    await fire('before');
    const out = await real();
    const after = await fire('after');
    return after?.rewrite ? (after.rewrite(out as never) as T) : out;
  }

  override vsnapStatus(options?: CallOptions): Promise<EngineStatus> {
    return this.through('status', async () => {
      const status = await super.vsnapStatus(options);
      if (!this.lacking.has('describe') && !this.lacking.has('digest')) return status;
      return { ...status, ranks: status.ranks.map((r) => ({ ...r, ...(this.lacking.has('describe') ? { describe: undefined } : {}), ...(this.lacking.has('digest') ? { digest: undefined } : {}) })) };
    });
  }
  override vsnapDescribe(options?: CallOptions): ReturnType<EngineWire['vsnapDescribe']> {
    return this.through('describe', () => super.vsnapDescribe(options));
  }
  override vsnapDigest(args: { chunkSize: number }, options?: CallOptions): Promise<EngineDigestTable[]> {
    return this.through('digest', () => super.vsnapDigest(args, options), args);
  }
  override vsnapExport(args: { socket: string; nonces: readonly string[]; digestChunkSize?: number }, options?: CallOptions): Promise<Array<{ rank: number; regions: number; bytes: number }>> {
    const sent = this.lacking.has('exportDigests') ? { socket: args.socket, nonces: args.nonces } : args;
    return this.through('export', () => super.vsnapExport(sent, options), args);
  }
  override vsnapSleep(args: { level: 1 | 2; mode?: 'abort' | 'wait' | 'keep' }, options?: CallOptions): Promise<void> {
    return this.through('sleep', () => super.vsnapSleep(args, options), args);
  }
  override vsnapWake(args: { tags?: readonly string[]; adopt?: { socket: string; nonces: readonly string[] } } = {}, options?: CallOptions): Promise<void> {
    // the weights' wake names them; the last wake of a restore wakes the KV cache (and any other tag left)
    const route: Route = args.adopt ? 'adopt' : args.tags?.includes('weights') ? 'wake' : 'wakeKv';
    return this.through(route, () => super.vsnapWake(args, options), args);
  }
  override vsnapResetPrefixCache(options?: CallOptions): Promise<void> {
    return this.through('reset', () => super.vsnapResetPrefixCache(options));
  }
  override vsnapReloadWeights(options?: CallOptions): Promise<void> {
    return this.through('reload', () => super.vsnapReloadWeights(options));
  }
}

/**
 * An EngineClient of a real engine with faults injected at chosen calls: the engine itself runs
 * unchanged, only this client's view of a call is broken. Records every call in `calls` (and
 * what was sent in `log`).
 */
export class FaultyClient extends EngineClient {
  declare readonly wire: FaultyWire;

  constructor(options: EngineClientOptions) {
    super(options);
    const own = this.wire as EngineWire;
    this.wire = new FaultyWire(options);
    void own.close();
  }

  /** Every route called, in order (a test may empty it). */
  get calls(): Route[] {
    return this.wire.calls;
  }

  /** Every call with its arguments, in order (a test may empty it). */
  get log(): LoggedCall[] {
    return this.wire.log;
  }

  inject(fault: Fault): void {
    this.wire.inject(fault);
  }

  clearFaults(): void {
    this.wire.clearFaults();
  }

  /** From now on (until `lack()` with none) it answers as an older plugin without these abilities: the flows take their fallbacks. */
  lack(...abilities: PluginAbility[]): void {
    this.wire.lacking = new Set(abilities);
  }

  override completions(body: Parameters<EngineClient['completions']>[0], options?: CallOptions): Promise<CompletionResult> {
    return this.wire.through('complete', () => super.completions(body, options));
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
