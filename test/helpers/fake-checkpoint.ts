import { VsnapError } from '../../src/errors.js';
import type { NativeGpuPair, NativeProcessState } from '../../src/native/index.js';
import type { CheckpointBackend } from '../../src/flows/deep.js';

type Op = 'state' | 'lock' | 'checkpoint' | 'restore' | 'unlock';

/**
 * The driver's process checkpoint state machine, per pid, as cuda.h documents it: lock
 * (running -> locked; on timeout stays running), checkpoint (locked -> checkpointed), restore
 * (checkpointed -> locked), unlock (locked -> running); any other transition is
 * CUDA_ERROR_ILLEGAL_STATE. Faults fail one call on one pid; `exit` makes a process gone.
 */
export class FakeCheckpointDriver implements CheckpointBackend {
  readonly states = new Map<number, NativeProcessState>();
  readonly calls: string[] = [];
  private readonly faults: Array<{ op: Op; pid: number; reason: string }> = [];
  private readonly gone = new Set<number>();
  unsupported = false;
  /** GPU pairs: like a driver before r580 when false. */
  remapSupported = true;
  /** The machine's GPUs (UUIDs) a remapping restore must name as a permutation, as the driver wants. */
  gpus: string[] = [];
  /** The GPU each pid is on (set it to use remapping restores); a remap moves it. */
  readonly gpuOf = new Map<number, string>();
  /** GPUs without room: a restore onto them fails with CUDA_ERROR_OUT_OF_MEMORY (reason memory). */
  readonly full = new Set<string>();
  /** The pairs each restore was given, by pid (the last one). */
  readonly pairsOf = new Map<number, readonly NativeGpuPair[]>();

  constructor(pids: readonly number[]) {
    for (const pid of pids) this.states.set(pid, 'running');
  }

  /** The next `op` on `pid` fails with E_CHECKPOINT of this reason (timeout, permission, driver). */
  fail(op: Op, pid: number, reason: string): void {
    this.faults.push({ op, pid, reason });
  }

  /** The process exits (its checkpoint, if any, is lost with it). */
  exit(pid: number): void {
    this.gone.add(pid);
    this.states.delete(pid);
  }

  /** Pids whose state is not running (what a failure must never leave behind). */
  notRunning(): Array<[number, NativeProcessState]> {
    return [...this.states].filter(([, s]) => s !== 'running');
  }

  private step(op: Op, pid: number, from: NativeProcessState, to: NativeProcessState): void {
    this.calls.push(`${op}:${pid}`);
    if (this.unsupported) throw new VsnapError('E_CHECKPOINT_UNSUPPORTED', 'the driver lacks the process checkpoint API');
    if (this.gone.has(pid)) throw this.error(op, pid, 'gone', 'CUDA_ERROR_INVALID_VALUE');
    const i = this.faults.findIndex((f) => f.op === op && f.pid === pid);
    if (i >= 0) {
      const [f] = this.faults.splice(i, 1);
      throw this.error(op, pid, f!.reason, f!.reason === 'timeout' ? 'CUDA_ERROR_NOT_READY' : 'CUDA_ERROR_UNKNOWN');
    }
    if (op === 'state') return;
    const now = this.states.get(pid);
    if (now !== from) throw this.error(op, pid, 'state', 'CUDA_ERROR_ILLEGAL_STATE');
    this.states.set(pid, to);
  }

  private error(op: Op, pid: number, reason: string, cudaError: string): VsnapError {
    return new VsnapError('E_CHECKPOINT', `cuCheckpointProcess ${op}(pid ${pid}) failed: ${cudaError}`, { pid, reason, cudaError, call: op });
  }

  async state(pid: number): Promise<NativeProcessState> {
    this.step('state', pid, 'running', 'running');
    return this.states.get(pid)!;
  }
  async lock(pid: number): Promise<void> {
    this.step('lock', pid, 'running', 'locked');
  }
  async checkpoint(pid: number): Promise<void> {
    this.step('checkpoint', pid, 'locked', 'checkpointed');
  }
  async restore(pid: number, pairs?: readonly NativeGpuPair[]): Promise<void> {
    if (pairs) this.pairsOf.set(pid, pairs);
    const target = pairs ? this.remapTarget(pid, pairs) : this.gpuOf.get(pid);
    if (target !== undefined && this.full.has(target) && this.states.get(pid) === 'checkpointed') {
      this.calls.push(`restore:${pid}`);
      throw this.error('restore', pid, 'memory', 'CUDA_ERROR_OUT_OF_MEMORY');
    }
    this.step('restore', pid, 'checkpointed', 'locked');
    if (target !== undefined) this.gpuOf.set(pid, target);
  }

  /** Where pairs send pid, refusing what the driver refuses: no pair support, or not a permutation of every GPU. */
  private remapTarget(pid: number, pairs: readonly NativeGpuPair[]): string | undefined {
    if (!this.remapSupported) {
      this.calls.push(`restore:${pid}`);
      throw new VsnapError('E_CHECKPOINT_UNSUPPORTED', 'GPU pairs need driver r580+', { reason: 'pairs' });
    }
    const olds = new Set(pairs.map((p) => p.oldUuid));
    const news = new Set(pairs.map((p) => p.newUuid));
    const whole = olds.size === this.gpus.length && news.size === this.gpus.length && this.gpus.every((g) => olds.has(g) && news.has(g));
    if (!whole || pairs.length !== this.gpus.length) {
      this.calls.push(`restore:${pid}`);
      throw this.error('restore', pid, 'driver', 'CUDA_ERROR_INVALID_VALUE');
    }
    const from = this.gpuOf.get(pid);
    return pairs.find((p) => p.oldUuid === from)?.newUuid;
  }
  async unlock(pid: number): Promise<void> {
    this.step('unlock', pid, 'locked', 'running');
  }
}
