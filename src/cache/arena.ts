/**
 * First-fit placement of extents in a fixed-size arena (the RAM tier's pinned buffer).
 * @internal
 */
export class Arena {
  private readonly used: Array<{ offset: number; size: number }> = [];

  constructor(readonly size: number, private readonly align = 4096) {}

  /** An offset where `size` bytes fit, or undefined. */
  allocate(size: number): number | undefined {
    const need = Math.ceil(Math.max(size, 1) / this.align) * this.align;
    let cursor = 0;
    for (let i = 0; i <= this.used.length; i++) {
      const next = this.used[i];
      const end = next ? next.offset : this.size;
      if (end - cursor >= need) {
        this.used.splice(i, 0, { offset: cursor, size: need });
        return cursor;
      }
      if (next) cursor = next.offset + next.size;
    }
    return undefined;
  }

  /** Gives back the end of the extent at `offset`: it keeps its first `size` bytes (rounded up to the alignment). */
  shrink(offset: number, size: number): void {
    const e = this.used.find((x) => x.offset === offset);
    if (e) e.size = Math.min(e.size, Math.ceil(Math.max(size, 1) / this.align) * this.align);
  }

  free(offset: number): void {
    const i = this.used.findIndex((e) => e.offset === offset);
    if (i >= 0) this.used.splice(i, 1);
  }

  get usedBytes(): number {
    return this.used.reduce((s, e) => s + e.size, 0);
  }
}
