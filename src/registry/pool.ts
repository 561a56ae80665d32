/**
 * Runs `fn` over `items` with at most `limit` at a time, taking the next item only when a
 * worker is free (a generator is planned lazily); the first failure stops new work and is thrown
 * once every started call has settled (nothing keeps writing after the caller sees the error).
 * @internal
 */
export async function runPool<T>(items: Iterable<T>, limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  const it = items[Symbol.iterator]();
  let failure: { error: unknown } | undefined;
  let exhausted = false;
  const take = (): { item: T } | undefined => {
    if (failure || exhausted) return undefined;
    try {
      const r = it.next();
      if (r.done) {
        exhausted = true;
        return undefined;
      }
      return { item: r.value };
    } catch (error) {
      failure ??= { error };
      return undefined;
    }
  };
  const worker = async (): Promise<void> => {
    for (let next = take(); next; next = take()) {
      try {
        await fn(next.item);
      } catch (error) {
        failure ??= { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, limit) }, worker));
  if (failure) throw failure.error;
}

/**
 * A byte budget shared by concurrent work, granted first come first served: `acquire(n)` waits
 * until n bytes are free. A request larger than the whole budget is granted the whole budget
 * (it then runs alone), so nothing waits forever.
 * @internal
 */
export class ByteBudget {
  private free: number;
  private readonly waiting: Array<{ n: number; grant: (release: () => void) => void }> = [];

  constructor(readonly total: number) {
    this.free = total;
  }

  acquire(bytes: number): Promise<() => void> {
    const n = Math.min(bytes, this.total);
    if (this.waiting.length === 0 && this.free >= n) {
      this.free -= n;
      return Promise.resolve(this.releaser(n));
    }
    return new Promise((grant) => this.waiting.push({ n, grant }));
  }

  private releaser(n: number): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.free += n;
      while (this.waiting.length > 0 && this.free >= this.waiting[0]!.n) {
        const next = this.waiting.shift()!;
        this.free -= next.n;
        next.grant(this.releaser(next.n));
      }
    };
  }
}

/**
 * Chunk buffers under a byte budget: `take(n)` waits for n bytes of the budget, then lends a
 * buffer of n bytes, reused from those given back, so one buffer serves part after part instead
 * of a fresh allocation per part lingering until the next GC. A buffer that fits none of the
 * idle ones is allocated and the idle ones are dropped: lent and idle bytes stay within the
 * budget (or one request larger than it).
 * @internal
 */
export class BufferPool {
  private readonly budget: ByteBudget;
  private idle: Buffer[] = [];

  constructor(total: number) {
    this.budget = new ByteBudget(total);
  }

  async take(n: number): Promise<{ buffer: Buffer; give: () => void }> {
    const release = await this.budget.acquire(n);
    let best = -1;
    for (let i = 0; i < this.idle.length; i++) if (this.idle[i]!.length >= n && (best < 0 || this.idle[i]!.length < this.idle[best]!.length)) best = i;
    let whole: Buffer;
    if (best >= 0) whole = this.idle.splice(best, 1)[0]!;
    else {
      this.idle = [];
      whole = Buffer.allocUnsafe(n);
    }
    let given = false;
    return {
      buffer: whole.subarray(0, n),
      give: () => {
        if (given) return;
        given = true;
        this.idle.push(whole);
        release();
      },
    };
  }
}
