import { toVsnapError } from '../errors.js';
import { native, type NativeHostBuffer } from '../native/index.js';
import { stagingIdleMs } from '../settings.js';

interface Kept {
  readonly buffers: readonly NativeHostBuffer[];
  readonly bytes: number;
  readonly pinned: boolean;
  timer?: NodeJS.Timeout;
}

/**
 * Host buffers of a restore's windows (a restore of coded store blobs reads its windows into two),
 * kept between restores like the staging pools, so pinning (about 0.08 s/GiB) stays off the
 * restore path: one set, lent to one restore at a time (another at the same time makes its own),
 * freed after the staging idle period or by releaseIdleResources().
 * @internal
 */
class WindowBuffers {
  private kept: Kept | undefined;

  /** Lends `count` buffers of at least `bytes` each (pinned, portable, where `pinDevice` >= 0). */
  async lease<T>(bytes: number, count: number, pinDevice: number, use: (buffers: readonly NativeHostBuffer[]) => Promise<T>): Promise<T> {
    const pinned = pinDevice >= 0;
    let set = this.kept;
    this.kept = undefined;
    if (set?.timer) clearTimeout(set.timer);
    if (set && (set.bytes < bytes || set.buffers.length < count || set.pinned !== pinned)) {
      for (const b of set.buffers) b.close();
      set = undefined;
    }
    if (!set) {
      const buffers: NativeHostBuffer[] = [];
      try {
        for (let i = 0; i < count; i++) buffers.push(await native().createHostBuffer(bytes, pinDevice));
      } catch (err) {
        for (const b of buffers) b.close();
        throw toVsnapError(err);
      }
      set = { buffers, bytes, pinned };
    }
    try {
      return await use(set.buffers.slice(0, count));
    } finally {
      this.keep(set);
    }
  }

  /** Bytes the kept set holds now (for leak checks). */
  heldBytes(): number {
    return this.kept ? this.kept.bytes * this.kept.buffers.length : 0;
  }

  /** Frees the kept set now. */
  releaseIdle(): void {
    const set = this.kept;
    this.kept = undefined;
    if (set?.timer) clearTimeout(set.timer);
    for (const b of set?.buffers ?? []) b.close();
  }

  /** Keeps `set` (the larger where one is kept already: a restore that ran beside this one returned it first). */
  private keep(set: Kept): void {
    const other = this.kept;
    if (other && other.bytes * other.buffers.length >= set.bytes * set.buffers.length) {
      for (const b of set.buffers) b.close();
      return;
    }
    this.releaseIdle();
    set.timer = setTimeout(() => {
      if (this.kept === set) this.releaseIdle();
    }, stagingIdleMs());
    set.timer.unref();
    this.kept = set;
  }
}

/**
 * One per process, shared by the ESM and CommonJS copies of vsnap (as the staging pools are).
 * @internal
 */
const REGISTRY = Symbol.for('vsnap.windowBuffers.v1');

/** @internal */
export const windowBuffers: WindowBuffers = ((globalThis as Record<symbol, unknown>)[REGISTRY] as WindowBuffers | undefined) ??
  ((globalThis as Record<symbol, unknown>)[REGISTRY] = new WindowBuffers()) as WindowBuffers;
