import { EngineClient, type CallOptions, type EngineStatus } from '../engine/engine-client.js';
import { invalidArgument } from '../errors.js';
import { checkOptions } from '../options.js';
import type { Snapshot } from '../snapshot/snapshot.js';
import { RegionStore } from '../store/region-store.js';
import { TIER_KEYS, type EngineTiers } from '../tiers/index.js';
import { captureEngine } from './capture.js';
import { restoreEngine } from './restore.js';
import { suspendEngine } from './suspend.js';
import { swapEngines, type EngineSwapReport, type SwapOverlap } from './swap.js';
import type { EngineCaptureOptions, EngineRestoreOptions, EngineRestoreReport, EngineSuspendOptions, EngineSuspendResult } from './types.js';

/**
 * The tiers an {@link EngineSession} suspends into and restores from: {@link EngineTiers} without
 * the engine's own tier 0 (`engine`), since a session's suspend always leaves a snapshot it can
 * restore or swap from (use {@link (suspendEngine:2)} for that tier).
 * @public
 */
export type EngineSessionTiers = Omit<EngineTiers, 'engine'>;

/**
 * What an {@link EngineSession} is opened with: the caller keeps owning each of them (the session
 * closes none).
 * @public
 */
export interface EngineSessionOptions {
  /** The engine. */
  readonly client: EngineClient;
  /** The store its snapshots go to and come from. */
  readonly store: RegionStore;
  /** The name of its snapshots in that store. */
  readonly name: string;
  /** Where its weights are kept while it sleeps, and looked for when it wakes; see {@link EngineTiers}. */
  readonly tiers?: EngineSessionTiers;
  /** Cancels the open (the engine's status read). */
  readonly signal?: AbortSignal;
}

/**
 * Options of {@link EngineSession.swap}: the overlap, and each side's own options (their tiers
 * are their sessions').
 * @public
 */
export interface EngineSessionSwapOptions {
  /** How far the two engines' steps run at once (default `weights`); see {@link EngineSwapOptions.overlap}. */
  readonly overlap?: SwapOverlap;
  /** This engine's suspend ({@link (suspendEngine:1)}'s options, without `tiers`). */
  readonly suspend?: Omit<EngineSuspendOptions, 'tiers'>;
  /** The other engine's restore ({@link restoreEngine}'s options, without `tiers`). */
  readonly restore?: Omit<EngineRestoreOptions, 'tiers'>;
}

const SESSION_OPTIONS = ['client', 'store', 'name', 'tiers', 'signal'];
const SWAP_OPTIONS = ['overlap', 'suspend', 'restore'];

/**
 * One engine with its store, snapshot name and tiers, held so that each step is one call:
 * {@link EngineSession.capture}, {@link EngineSession.suspend}, {@link EngineSession.restore},
 * {@link EngineSession.swap}. Each builds its plan and runs it as {@link captureEngine},
 * {@link (suspendEngine:1)}, {@link restoreEngine} and {@link swapEngines} do, with the session's
 * client, store, name and tiers. Open one with {@link EngineSession.open}.
 * @public
 */
export class EngineSession {
  /** The engine. */
  readonly client: EngineClient;
  /** The store its snapshots go to and come from. */
  readonly store: RegionStore;
  /** The name of its snapshots in the store. */
  readonly name: string;
  /** The tiers its suspends keep the weights in and its restores look in (none: the store only). */
  readonly tiers: EngineSessionTiers;

  private constructor(options: EngineSessionOptions) {
    this.client = options.client;
    this.store = options.store;
    this.name = options.name;
    this.tiers = options.tiers ?? {};
  }

  /**
   * Opens a session on an engine: checks the options and reads the engine's status (which also
   * picks the routes it is driven through), so that an engine that cannot be driven fails here.
   */
  static async open(options: EngineSessionOptions): Promise<EngineSession> {
    checkOptions('EngineSession options', options, SESSION_OPTIONS);
    if (!(options?.client instanceof EngineClient)) invalidArgument('client', 'an EngineClient', options?.client);
    if (!(options.store instanceof RegionStore)) invalidArgument('store', 'a RegionStore', options.store);
    if (typeof options.name !== 'string' || options.name === '') invalidArgument('name', 'a snapshot name', options.name);
    if (options.tiers && 'engine' in options.tiers) {
      invalidArgument('tiers.engine', "absent: a session's suspend leaves a snapshot (use suspendEngine for the engine's own tier 0)", options.tiers.engine);
    }
    checkOptions('EngineSession tiers', options.tiers, TIER_KEYS.filter((k) => k !== 'engine'));
    await options.client.status(options.signal ? { signal: options.signal } : {});
    return new EngineSession(options);
  }

  /** The engine as its plugin sees it now (see {@link EngineClient.status}). */
  async status(options?: CallOptions): Promise<EngineStatus> {
    return this.client.status(options);
  }

  /**
   * Captures the engine's weights into the store under the session's name, landing in the
   * session's RAM tier first where it has one (see {@link captureEngine}).
   */
  async capture(options: Omit<EngineCaptureOptions, 'ram'> = {}): Promise<Snapshot> {
    if (options && 'ram' in options) invalidArgument('EngineSession.capture options.ram', "absent: the capture lands in the session's RAM tier (tiers.ram)", (options as { ram: unknown }).ram);
    return captureEngine(this.store, this.name, this.client, { ...options, ...(this.tiers.ram ? { ram: this.tiers.ram } : {}) });
  }

  /**
   * Puts the engine to sleep, its weights kept in the session's tiers and its snapshot checked
   * (captured again where it changed; see {@link (suspendEngine:1)}).
   */
  async suspend(options: Omit<EngineSuspendOptions, 'tiers'> = {}): Promise<EngineSuspendResult> {
    noTiers('EngineSession.suspend options', options);
    return suspendEngine(this.store, this.name, this.client, { ...options, tiers: this.tiers });
  }

  /**
   * Brings the engine back from the session's tiers, else from the store's current snapshot of
   * the session's name (see {@link restoreEngine}).
   */
  async restore(options: Omit<EngineRestoreOptions, 'tiers'> = {}): Promise<EngineRestoreReport> {
    noTiers('EngineSession.restore options', options);
    return restoreEngine({ store: this.store, name: this.name }, this.client, { ...options, tiers: this.tiers });
  }

  /**
   * Puts this engine to sleep and brings `other` back, overlapped (see {@link swapEngines}): this
   * session's suspend, the other session's restore, each with its own store, name and tiers.
   */
  async swap(other: EngineSession, options: EngineSessionSwapOptions = {}): Promise<EngineSwapReport> {
    if (!(other instanceof EngineSession)) invalidArgument('other', 'an EngineSession', other);
    checkOptions('EngineSession.swap options', options, SWAP_OPTIONS);
    noTiers('EngineSession.swap suspend options', options.suspend);
    noTiers('EngineSession.swap restore options', options.restore);
    return swapEngines({
      suspend: { ...options.suspend, client: this.client, store: this.store, name: this.name, tiers: this.tiers },
      restore: { ...options.restore, source: { store: other.store, name: other.name }, client: other.client, tiers: other.tiers },
      ...(options.overlap ? { overlap: options.overlap } : {}),
    });
  }
}

/** A step's options cannot carry tiers: the session's are the ones it was opened with. */
function noTiers(what: string, options: object | undefined): void {
  if (options && 'tiers' in options) invalidArgument(`${what}.tiers`, 'absent: the session uses the tiers it was opened with', (options as { tiers: unknown }).tiers);
}
