import type { Dispatcher } from 'undici';

import { abortError, VsnapError } from '../errors.js';

/**
 * Deadlines of every registry request. A request fails with E_REGISTRY_TIMEOUT (its URL in the
 * message and `details.url`) when it stalls or when it runs slower than a floor rate.
 * @public
 */
export interface RegistryTimeouts {
  /** No byte received (or sent) for this long while vsnap waits for one: the request fails. Default 60 000 ms. */
  readonly stallMs?: number;
  /** The time every request may take before `minBytesPerSecond` applies. Default 60 000 ms. */
  readonly graceMs?: number;
  /**
   * The slowest average rate a request may run at: its deadline is `graceMs` plus the time its
   * bytes so far need at this rate, so it grows with the bytes. Default 65 536 (64 KiB/s).
   */
  readonly minBytesPerSecond?: number;
}

/**
 * The deadlines of one request: it fails when no byte moves for `stallMs` while vsnap waits for
 * one, or when, after `graceMs`, it has averaged less than `minBytesPerSecond` (its deadline
 * grows with the bytes moved). One timer, re-armed only when it fires, so a byte costs two
 * assignments. The caller's signal aborts it too.
 * @internal
 */
export class Watchdog {
  /** Aborts the request: the caller's signal, or a deadline. */
  readonly signal: AbortSignal;
  /** The deadline's error, once one passed. */
  error: VsnapError | undefined;
  private readonly controller = new AbortController();
  private readonly started = performance.now();
  private last = this.started;
  private bytes = 0;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private readonly onUserAbort: (() => void) | undefined;

  constructor(
    private readonly limits: Required<RegistryTimeouts>,
    private readonly url: URL,
    private readonly what: string,
    private readonly user: AbortSignal | undefined,
  ) {
    this.signal = this.controller.signal;
    if (user) {
      this.onUserAbort = () => this.controller.abort(user.reason);
      user.addEventListener('abort', this.onUserAbort, { once: true });
    }
    this.arm(Math.min(limits.stallMs, limits.graceMs));
  }

  /** Bytes moved (0: vsnap is ready for more, after work of its own that the stall must not count). */
  progress(n: number): void {
    this.bytes += n;
    this.last = performance.now();
  }

  /** The caller's signal, when it fired. */
  get userAbort(): AbortSignal | undefined {
    return this.user?.aborted ? this.user : undefined;
  }

  get bytesMoved(): number {
    return this.bytes;
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.onUserAbort) this.user!.removeEventListener('abort', this.onUserAbort);
  }

  private arm(ms: number): void {
    this.timer = setTimeout(this.check, Math.max(1, Math.ceil(ms)));
    this.timer.unref();
  }

  private readonly check = (): void => {
    if (this.stopped) return;
    const now = performance.now();
    const { stallMs, graceMs, minBytesPerSecond } = this.limits;
    const stallLeft = this.last + stallMs - now;
    const deadlineLeft = this.started + graceMs + (this.bytes / minBytesPerSecond) * 1000 - now;
    if (stallLeft > 0 && deadlineLeft > 0) {
      this.arm(Math.min(stallLeft, deadlineLeft));
      return;
    }
    const where = `${this.url.origin}${this.url.pathname}`;
    const seconds = ((now - this.started) / 1000).toFixed(1);
    const message =
      stallLeft <= 0
        ? `${this.what}: ${where} sent nothing for ${stallMs} ms (${this.bytes} bytes moved in ${seconds} s); the registry or the network path to it stalled. Try again; \`timeouts.stallMs\` sets how long a request may go without a byte.`
        : `${this.what}: ${where} moved ${this.bytes} bytes in ${seconds} s, slower than the floor of ${minBytesPerSecond} bytes/s after ${graceMs} ms; the registry is trickling. Try again; \`timeouts.minBytesPerSecond\` and \`timeouts.graceMs\` set the floor.`;
    this.error = new VsnapError('E_REGISTRY_TIMEOUT', message, { url: where, reason: stallLeft <= 0 ? 'stall' : 'deadline', bytes: this.bytes, seconds: Number(seconds) });
    this.stop();
    this.controller.abort(this.error);
  };
}

type RawBody = Dispatcher.ResponseData['body'];

/**
 * A response body read only in bounded ways: streamed in pieces, read whole up to a limit (the
 * declared Content-Length is checked first, so an oversized body is refused unread), a prefix
 * for error messages, or dropped. A broken connection or a passed deadline surfaces as a coded
 * error naming the URL.
 * @internal
 */
export class OciBody {
  constructor(
    private readonly raw: RawBody,
    private readonly watch: Watchdog,
    private readonly url: URL,
    private readonly what: string,
    /** The Content-Length the registry declared, if any. */
    readonly contentLength: number | undefined,
  ) {
    if (raw.readableEnded || raw.destroyed) watch.stop();
    else raw.once('close', () => watch.stop());
  }

  /** The body in pieces as they arrive; breaking out of the loop closes the connection. */
  async *chunks(): AsyncGenerator<Buffer, void, undefined> {
    try {
      for await (const data of this.raw as AsyncIterable<Buffer>) {
        this.watch.progress(data.length);
        yield data;
        this.watch.progress(0); // vsnap's own work on the piece is not the registry's stall
      }
    } catch (err) {
      throw this.failure(err);
    }
  }

  /** The whole body, refused (tooLarge) past `limit` bytes without reading further. */
  async read(limit: number, tooLarge: (bytes: number) => VsnapError): Promise<Buffer> {
    if (this.contentLength !== undefined && this.contentLength > limit) {
      this.raw.destroy();
      throw tooLarge(this.contentLength);
    }
    const parts: Buffer[] = [];
    let n = 0;
    for await (const data of this.chunks()) {
      n += data.length;
      if (n > limit) throw tooLarge(n); // leaving the loop closes the connection
      parts.push(data);
    }
    return Buffer.concat(parts, n);
  }

  async text(limit: number, tooLarge: (bytes: number) => VsnapError): Promise<string> {
    return (await this.read(limit, tooLarge)).toString('utf8');
  }

  /** At most the first `limit` bytes as text (for an error message): the rest is not read; a failure gives what came. */
  async prefix(limit: number): Promise<string> {
    const parts: Buffer[] = [];
    let n = 0;
    try {
      for await (const data of this.chunks()) {
        parts.push(data);
        n += data.length;
        if (n >= limit) break;
      }
    } catch {
      /* the body is only for the message */
    }
    return Buffer.concat(parts, n).subarray(0, limit).toString('utf8');
  }

  /** Drops the body (a small one is read to keep the connection; a large one closes it). */
  async dump(): Promise<void> {
    try {
      await this.raw.dump();
    } catch {
      /* nothing of it was wanted */
    }
  }

  private failure(err: unknown): VsnapError {
    if (this.watch.userAbort) return abortError(this.watch.userAbort, 'the registry transfer');
    if (this.watch.error) return this.watch.error;
    if (err instanceof VsnapError) return err;
    const e = err as Error & { code?: string };
    const where = `${this.url.origin}${this.url.pathname}`;
    return new VsnapError(
      'E_REGISTRY',
      `${this.what}: the connection to ${this.url.origin} broke after ${this.watch.bytesMoved} bytes of ${where} (${e.code ?? e.name}: ${e.message}). Try again: nothing partial was kept.`,
      { url: where, errno: e.code, bytes: this.watch.bytesMoved },
      { cause: err },
    );
  }
}
