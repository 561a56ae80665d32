import type { VsnapError } from '../errors.js';
import type { TierName } from '../tiers/tier.js';
import type { EngineSpec } from './options.js';
import type { EngineState } from './planner.js';
import type { Damage } from './readiness.js';
import type { EngineView, Lease, RecoveryView } from './types.js';

/*
 * One engine's live state in the controller (a slot), and the only functions that change it. The
 * state is one of a few shapes, each with just the facts it has; the facts that really are
 * orthogonal to it (its placement, its use, what is known of its snapshot, its last recovery) sit
 * beside it in groups. Only the executor calls the transitions, from its serial queue (leases and
 * waiters change outside it, as requests come and go); everything else reads views.
 */

/**
 * Asleep, `tier` saying where its weights are as its suspend left them (the tier its wake restores
 * from): at level 2 (it holds its `asleepBytes`) with its weights in the store or the RAM tier,
 * parked on the neighbour GPU, or held on its own GPU by tier 0 (`locked`: they failed the dirty
 * check, so they are never demoted); or asleep with its weights kept by the engine itself (it
 * counts as awake); or deep (its processes checkpointed: it holds nothing on the GPU).
 * @internal
 */
export type Asleep =
  | { readonly kind: 'asleep'; readonly tier: Exclude<TierName, 'gpu'> }
  | { readonly kind: 'asleep'; readonly tier: 'gpu'; readonly locked?: string }
  | { readonly kind: 'deep' };

/**
 * What an engine is doing. `waking` remembers what it woke from (a failed wake goes back to it),
 * and in an overlapped swap, until the other engine sleeps, what it holds per device (`holding`,
 * counted instead of its `memoryBytes`). `failed` (it does not answer, or a failed restore left it
 * awake with unverified weights) remembers what it last slept as.
 * @internal
 */
export type SlotState =
  | { readonly kind: 'awake' }
  | { readonly kind: 'waking'; readonly from: Asleep; readonly holding?: number }
  | { readonly kind: 'suspending' }
  | Asleep
  | { readonly kind: 'failed'; readonly error: string; readonly asleep?: Asleep };

/** A request waiting for its engine. @internal */
export interface Waiter {
  resolve(lease: Lease): void;
  reject(err: VsnapError): void;
  readonly since: number;
}

/** One engine's live state. @internal */
export interface Slot {
  /** The engine as configured (never rewritten: where it runs now is `devices`). */
  readonly spec: EngineSpec;
  readonly state: SlotState;
  /** The GPUs it runs on now: its spec's, or where a move put it. */
  readonly devices: readonly number[];
  /** Requests using it now, when it was last used, and the requests waiting for it. */
  readonly leases: number;
  readonly lastUsed: number;
  readonly waiters: readonly Waiter[];
  /** The last failure of a step that left it in another state than `failed` (a suspend, a demotion). */
  readonly lastError?: string;
  /** After a failed swap: left alone in the background until then. */
  readonly retryAt?: number;
  /** What is known of its snapshot: why it cannot bring it back (until re-captured or verified), and its largest rank in bytes (its weights for an overlapped swap). */
  readonly snapshot: { readonly damage?: Damage; readonly weightsBytes?: number };
  /** Its last recovery through the engine's own loader, and the background capture after it (a suspend waits for that). */
  readonly recovery: { readonly last?: RecoveryView; readonly capture?: Promise<void> };
  /** `vsnap serve` is booting it (outside the controller): counted awake, with one lease that is no request, until released. */
  readonly booting?: true;
}

type Writable<T> = { -readonly [K in keyof T]: T[K] };
const w = (slot: Slot): Writable<Slot> => slot as Writable<Slot>;

/** What a sleep of it leaves when nothing else is known: deep for a deepSuspend engine, else its weights in the store. */
const presumed = (spec: EngineSpec): Asleep => (spec.deepSuspend ? { kind: 'deep' } : { kind: 'asleep', tier: 'store' });

/** A slot for an engine not yet asked: asleep, until its state is read. @internal */
export function newSlot(spec: EngineSpec): Slot {
  return { spec, state: presumed(spec), devices: spec.devices, leases: 0, lastUsed: 0, waiters: [], snapshot: {}, recovery: {} };
}

/** What it sleeps as, or last slept as (before it began to wake, or failed), if known. @internal */
export function sleepOf(state: SlotState): Asleep | undefined {
  switch (state.kind) {
    case 'asleep':
    case 'deep':
      return state;
    case 'waking':
      return state.from;
    case 'failed':
      return state.asleep;
    default:
      return undefined;
  }
}

/** Its sleep, or what its next sleep will be. */
export const nextSleep = (slot: Slot): Asleep => sleepOf(slot.state) ?? presumed(slot.spec);

/** The state as views and the planner name it. @internal */
export function engineState(state: SlotState): EngineState {
  return state.kind === 'deep' ? 'asleep' : state.kind;
}

/** Whether the engine itself keeps its weights while it sleeps (its own tier 0). @internal */
export function keptByEngine(state: SlotState): boolean {
  const s = sleepOf(state);
  return s?.kind === 'asleep' && s.tier === 'engine';
}

/** Its tier-0 weights failed the dirty check: never demoted. @internal */
export function holdLocked(state: SlotState): boolean {
  const s = sleepOf(state);
  return s?.kind === 'asleep' && s.tier === 'gpu' && s.locked !== undefined;
}

/** Replaces what it sleeps (or last slept) as. */
function resleep(slot: Slot, f: (s: Asleep) => Asleep): void {
  const s = slot.state;
  if (s.kind === 'asleep' || s.kind === 'deep') w(slot).state = f(s);
  else if (s.kind === 'waking') w(slot).state = { ...s, from: f(s.from) };
  else if (s.kind === 'failed') w(slot).state = { ...s, asleep: f(s.asleep ?? presumed(slot.spec)) };
}

/** Records a failure: the error of a failed engine, else its last error. */
function noteError(slot: Slot, message: string): void {
  if (slot.state.kind === 'failed') w(slot).state = { ...slot.state, error: message };
  else w(slot).lastError = message;
}

// ---- The engine answered, or did not.

/** It answered: awake, or asleep as it slept before (else as a sleep of it leaves). @internal */
export function answered(slot: Slot, sleeping: boolean): void {
  w(slot).state = sleeping ? nextSleep(slot) : { kind: 'awake' };
  delete w(slot).lastError;
}

/** It did not answer. @internal */
export function unreachable(slot: Slot, message: string): void {
  w(slot).state = { kind: 'failed', error: message, ...withAsleep(sleepOf(slot.state)) };
}

const withAsleep = (asleep: Asleep | undefined): { asleep?: Asleep } => (asleep ? { asleep } : {});

// ---- Waking.

/** A wake begins; `holding`: in an overlapped swap, what it holds until the other engine sleeps. @internal */
export function waking(slot: Slot, holding?: number): void {
  w(slot).state = { kind: 'waking', from: nextSleep(slot), ...(holding !== undefined ? { holding } : {}) };
}

/** In an overlapped swap, the other engine sleeps: it counts as awake from now. @internal */
export function roomMade(slot: Slot): void {
  if (slot.state.kind === 'waking') w(slot).state = { kind: 'waking', from: slot.state.from };
}

/** It woke, on `onto` when it was moved there. @internal */
export function woke(slot: Slot, onto: readonly number[] | undefined): void {
  const s = w(slot);
  s.state = { kind: 'awake' };
  if (onto) s.devices = onto;
  s.lastUsed = Date.now();
  delete s.lastError;
  delete s.retryAt;
}

/** A wake of a deep engine failed after its processes came back (onto `onto`): it sleeps at level 2 there now. @internal */
export function processesBack(slot: Slot, onto: readonly number[] | undefined): void {
  if (slot.state.kind === 'waking') w(slot).state = { ...slot.state, from: { kind: 'asleep', tier: 'store' } };
  if (onto) w(slot).devices = onto;
}

/** A failed wake, once its state was read back: `unverified` (awake, or not put back to sleep) makes it failed. @internal */
export function wakeFailed(slot: Slot, message: string, unverified: boolean): void {
  if (unverified) w(slot).state = { kind: 'failed', error: message, ...withAsleep(sleepOf(slot.state)) };
  noteError(slot, message);
}

// ---- Sleeping.

/** A suspend begins. @internal */
export function suspending(slot: Slot): void {
  w(slot).state = { kind: 'suspending' };
}

/** It sleeps, as `asleep`. @internal */
export function suspended(slot: Slot, asleep: Asleep): void {
  w(slot).state = asleep;
  delete w(slot).retryAt;
}

/** It sleeps with its weights kept by the engine itself. @internal */
export function keptAsleep(slot: Slot): void {
  w(slot).state = { kind: 'asleep', tier: 'engine' };
}

/** A failed suspend, once its state was read back; `deepStepFailed`: a deep suspend rolled back to a level-2 sleep. @internal */
export function suspendFailed(slot: Slot, message: string, deepStepFailed: boolean, retryAt?: number): void {
  if (deepStepFailed && slot.state.kind === 'deep') w(slot).state = { kind: 'asleep', tier: 'store' };
  noteError(slot, message);
  if (retryAt !== undefined) w(slot).retryAt = retryAt;
}

/** Tier 0 released its weights: they are in the RAM tier or the store now. @internal */
export function demoted(slot: Slot, tier: 'ram' | 'store'): void {
  resleep(slot, (s) => (s.kind === 'asleep' && s.tier === 'gpu' ? { kind: 'asleep', tier } : s));
}

/** Its parked copy was evicted from the neighbour tier. @internal */
export function unparked(slot: Slot, tier: 'ram' | 'store'): void {
  resleep(slot, (s) => (s.kind === 'asleep' && s.tier === 'neighbour' ? { kind: 'asleep', tier } : s));
}

/** Its tier-0 weights failed the dirty check before a demotion: kept, never demoted. @internal */
export function lockHold(slot: Slot, problem: string): void {
  resleep(slot, () => ({ kind: 'asleep', tier: 'gpu', locked: problem }));
  noteError(slot, `tier-0 weights kept, not demoted: ${problem}`);
}

/** After a failed swap: left alone by background steps until `until`. @internal */
export function cool(slot: Slot, until: number): void {
  w(slot).retryAt = until;
}

// ---- The boot of an engine by `vsnap serve`.

/** Held for its boot: awake and in use, so it is never woken, suspended or given requests, and its memory never given away. @internal */
export function bootHeld(slot: Slot): void {
  w(slot).state = { kind: 'awake' };
  w(slot).leases = slot.leases + 1;
  w(slot).booting = true;
}

/** Its boot is over: its hold lets go (its state is read next). Whether it was held. @internal */
export function bootReleased(slot: Slot): boolean {
  if (!slot.booting) return false;
  delete w(slot).booting;
  w(slot).leases = Math.max(0, slot.leases - 1);
  return true;
}

// ---- Use.

/** A lease is handed out (or, with -1, released). @internal */
export function used(slot: Slot, leases: 1 | -1): void {
  w(slot).leases = slot.leases + leases;
  w(slot).lastUsed = Date.now();
}

/** It was touched (re-read after a restart, say): last used now. @internal */
export function touched(slot: Slot): void {
  w(slot).lastUsed = Date.now();
}

/** A request begins to wait for it. @internal */
export function enqueue(slot: Slot, waiter: Waiter): void {
  w(slot).waiters = [...slot.waiters, waiter];
}

/** A request stops waiting (granted, refused, timed out or cancelled). @internal */
export function dequeue(slot: Slot, waiter: Waiter): void {
  if (slot.waiters.includes(waiter)) w(slot).waiters = slot.waiters.filter((x) => x !== waiter);
}

/** Every waiting request, taken off the queue. @internal */
export function takeWaiters(slot: Slot): Waiter[] {
  const all = [...slot.waiters];
  w(slot).waiters = [];
  return all;
}

// ---- Its snapshot, and its recovery.

/** Its snapshot cannot bring it back (or, undefined, can again). @internal */
export function damaged(slot: Slot, damage: Damage | undefined): void {
  const { damage: _old, ...rest } = slot.snapshot;
  w(slot).snapshot = damage ? { ...rest, damage } : rest;
}

/** Its snapshot's largest rank, in bytes. @internal */
export function snapshotWeights(slot: Slot, bytes: number | undefined): void {
  const { weightsBytes: _old, ...rest } = slot.snapshot;
  w(slot).snapshot = bytes === undefined ? rest : { ...rest, weightsBytes: bytes };
}

/** A restore went through the engine's own loader (or, undefined, through its snapshot: the last recovery is forgotten). @internal */
export function recovered(slot: Slot, view: RecoveryView | undefined): void {
  const { last: _old, ...rest } = slot.recovery;
  w(slot).recovery = view ? { ...rest, last: view } : rest;
}

/** The background capture after a recovery begins (or, undefined, ended). @internal */
export function capturing(slot: Slot, capture: Promise<void> | undefined): void {
  const { capture: _old, ...rest } = slot.recovery;
  w(slot).recovery = capture ? { ...rest, capture } : rest;
}

// ---- Views.

/** What status pages see; `held`: tier-0 bytes per device, `parked`: bytes in the neighbour tier. @internal */
export function viewOf(slot: Slot, held: number, parked: number): EngineView {
  const error = slot.state.kind === 'failed' ? slot.state.error : slot.lastError;
  return {
    name: slot.spec.name,
    state: engineState(slot.state),
    devices: slot.devices,
    leases: slot.leases - (slot.booting ? 1 : 0), // the boot's hold is no request
    waiting: slot.waiters.length,
    lastUsed: slot.lastUsed,
    pinned: slot.spec.pinned ?? false,
    ...(error ? { error } : {}),
    ...(slot.snapshot.damage ? { snapshotProblem: slot.snapshot.damage.reason } : {}),
    ...(held > 0 ? { weightsHeldBytes: held } : {}),
    ...(slot.recovery.last ? { recovery: { ...slot.recovery.last } } : {}),
    ...(parked > 0 ? { neighbourBytes: parked } : {}),
  };
}
