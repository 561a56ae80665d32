/**
 * Batches handed from a producer to one consumer as they are made (a restore's memory, made part
 * by part, to its copy): `send` each, then `end` (or `fail`); the consumer iterates with `for
 * await`, which ends after the last batch or throws the failure once the batches before it were
 * taken. Unbounded: the producer is the restore's own memory making, bounded by the snapshot.
 * @internal
 */
export class Batches<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private done = false;
  private failure: { reason: unknown } | undefined;
  private wake: (() => void) | undefined;

  send(item: T): void {
    if (this.done) throw new Error('Batches: send after end');
    this.items.push(item);
    this.notify();
  }

  end(): void {
    this.done = true;
    this.notify();
  }

  fail(reason: unknown): void {
    if (this.done) return;
    this.failure = { reason };
    this.done = true;
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    while (true) {
      if (this.items.length > 0) {
        yield this.items.shift()!;
        continue;
      }
      if (this.failure) throw this.failure.reason;
      if (this.done) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}
