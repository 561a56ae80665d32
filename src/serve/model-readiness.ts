import { EventEmitter } from 'node:events';

/**
 * Where a model of `vsnap serve` stands before it can be served: `waiting` for its turn to
 * boot (engines boot one at a time), `starting` its engine, `pulling` its snapshot from a
 * registry, `preparing` it (capture if needed, suspend), `ready`, or `failed` (its boot failed).
 * @public
 */
export type ModelPhase = 'waiting' | 'starting' | 'pulling' | 'preparing' | 'ready' | 'failed';

/**
 * A model's readiness, for `/healthz`, the status page and requests refused while it is not ready.
 * @public
 */
export interface ModelReadiness {
  /** The model name. */
  readonly name: string;
  /** Whether requests for it are served. */
  readonly ready: boolean;
  /** Its phase. */
  readonly phase: ModelPhase;
  /** Why it is not ready (what it waits for, or what failed). Absent once ready. */
  readonly reason?: string;
  /** When the phase began, ms since the epoch. */
  readonly since: number;
  /** A pull's bytes so far and in all, while `pulling`. */
  readonly progress?: { readonly phase: string; readonly bytesDone: number; readonly bytesTotal: number; readonly lastProgressAt: number };
}

/**
 * Where the agent reads whether a model is ready ({@link SwapAgentOptions.readiness}).
 * @public
 */
export interface ModelReadinessSource {
  /** A model's readiness (undefined: not tracked, served as usual). */
  get(name: string): ModelReadiness | undefined;
  /** Every model's. */
  views(): readonly ModelReadiness[];
  /** Called with a model's new readiness (the status page updates live). */
  on?(event: 'change', listener: (r: ModelReadiness) => void): unknown;
  /** Stops calling a listener. */
  off?(event: 'change', listener: (r: ModelReadiness) => void): unknown;
}

/**
 * The readiness of every model of a `vsnap serve`: serve sets it as the boot goes, the agent
 * refuses requests for a model that is not ready (503 E_NOT_READY, with the reason), and the
 * status report shows it. Emits `change` with the model's new {@link ModelReadiness}.
 * @internal
 */
export class ModelReadinessBoard extends EventEmitter implements ModelReadinessSource {
  private readonly models = new Map<string, ModelReadiness>();

  constructor(names: readonly string[]) {
    super();
    for (const name of names) this.models.set(name, { name, ready: true, phase: 'ready', since: Date.now() });
  }

  /** A model enters a phase (with why it is not ready). */
  set(name: string, phase: Exclude<ModelPhase, 'ready'>, reason: string): void {
    this.put({ name, ready: false, phase, reason, since: Date.now() });
  }

  /** A pull moved (or the watch noticed it did not): the reason says where it stands. */
  progress(name: string, reason: string, progress: NonNullable<ModelReadiness['progress']>): void {
    const now = this.models.get(name);
    this.put({ name, ready: false, phase: 'pulling', reason, since: now?.phase === 'pulling' ? now.since : Date.now(), progress });
  }

  ready(name: string): void {
    this.put({ name, ready: true, phase: 'ready', since: Date.now() });
  }

  get(name: string): ModelReadiness | undefined {
    return this.models.get(name);
  }

  views(): ModelReadiness[] {
    return [...this.models.values()];
  }

  private put(r: ModelReadiness): void {
    if (!this.models.has(r.name)) return;
    this.models.set(r.name, r);
    this.emit('change', r);
  }
}
