import { randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { abortError, invalidArgument, toVsnapError, VsnapError } from '../errors.js';
import { native, type NativeFdEvent, type NativeFdListener } from '../native/index.js';

/**
 * What a peer sent: its JSON header (parsed) and the descriptors, which the caller now owns.
 * @public
 */
export interface FdMessage {
  /** The sender's JSON header, parsed. */
  readonly header: unknown;
  /** The received descriptors, in the order sent; close them when done. */
  readonly fds: readonly number[];
  /** The sender's pid (from the kernel, not from the message). */
  readonly pid: number;
}

/**
 * Receives file descriptors from other processes of the same user: a unix socket (mode 0600,
 * same-uid peers only, checked with SO_PEERCRED) where each transfer is authorised by a
 * one-time nonce. The protocol is documented in native/ipc/fd_channel.h; senders exist for
 * Node ({@link sendFds}) and Python (`socket.send_fds`).
 *
 * ```ts
 * const receiver = await FdReceiver.listen();
 * const { nonce, message } = receiver.expect({ timeoutMs: 10_000 });
 * // hand receiver.path and nonce to the peer, which connects and sends
 * const { header, fds } = await message;
 * ```
 * @public
 */
export class FdReceiver {
  /** The socket path peers connect to. */
  readonly path: string;
  private readonly listener: NativeFdListener;
  private readonly ownedDir: string | undefined;
  private readonly pending = new Map<string, { resolve: (m: FdMessage) => void; reject: (e: VsnapError) => void }>();
  private readonly rejections: string[] = [];
  private closed = false;

  private constructor(path: string, ownedDir: string | undefined) {
    this.path = path;
    this.ownedDir = ownedDir;
    try {
      this.listener = new (native().FdListener)(path, (event) => this.onEvent(event));
    } catch (err) {
      if (ownedDir) rmSync(ownedDir, { recursive: true, force: true });
      throw toVsnapError(err);
    }
    this.listener.unref();
  }

  /**
   * Starts listening. Without a path, the socket goes in a new private (0700) directory under
   * the system temp directory, removed again on close.
   */
  static async listen(path?: string): Promise<FdReceiver> {
    if (path !== undefined) {
      if (typeof path !== 'string' || path.length === 0) invalidArgument('path', 'a socket path', path);
      return new FdReceiver(path, undefined);
    }
    const dir = mkdtempSync(join(tmpdir(), 'vsnap-'));
    return new FdReceiver(join(dir, 'fd.sock'), dir);
  }

  /**
   * Authorises one transfer: returns a fresh nonce to give the peer, and a promise of its
   * message. The nonce works once; after `timeoutMs` (default 30 s) or an abort it stops working
   * and the promise rejects (E_TIMEOUT / E_ABORTED).
   */
  expect(options: { timeoutMs?: number; signal?: AbortSignal } = {}): { nonce: string; message: Promise<FdMessage> } {
    return this.register(undefined, options);
  }

  /**
   * Offers descriptors to one peer: the peer that presents the returned nonce (with
   * {@link fetchFds}, or `vsnap_vllm.fdsend.fetch_fds` in Python) receives `header` and
   * duplicates of `fds` (yours stay open). `taken` resolves with what the peer sent when it
   * fetched them; after `timeoutMs` (default 30 s) the offer is withdrawn (E_TIMEOUT).
   */
  offer(header: unknown, fds: readonly number[], options: { timeoutMs?: number; signal?: AbortSignal } = {}): { nonce: string; taken: Promise<FdMessage> } {
    const { nonce, message } = this.register({ header: JSON.stringify(header), fds }, options);
    return { nonce, taken: message };
  }

  private register(
    offer: { header: string; fds: readonly number[] } | undefined,
    options: { timeoutMs?: number; signal?: AbortSignal },
  ): { nonce: string; message: Promise<FdMessage> } {
    if (this.closed) throw new VsnapError('E_CLOSED', 'this FdReceiver was closed');
    const nonce = randomBytes(32).toString('hex');
    const timeoutMs = options.timeoutMs ?? 30_000;
    const message = new Promise<FdMessage>((resolve, reject) => {
      const finish = (): void => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        this.pending.delete(nonce);
        if (!this.closed) this.listener.forget(nonce);
        if (this.pending.size === 0 && !this.closed) this.listener.unref();
      };
      const onAbort = (): void => {
        finish();
        reject(abortError(options.signal, 'waiting for descriptors'));
      };
      const timer = setTimeout(() => {
        finish();
        const recent = this.rejections.slice(-3);
        reject(
          new VsnapError(
            'E_TIMEOUT',
            `no peer sent descriptors to ${this.path} within ${timeoutMs} ms` +
              (recent.length ? `; rejected meanwhile: ${recent.join('; ')}` : ''),
            { path: this.path, rejected: recent },
          ),
        );
      }, timeoutMs);
      this.pending.set(nonce, {
        resolve: (m) => {
          finish();
          resolve(m);
        },
        reject: (e) => {
          finish();
          reject(e);
        },
      });
      if (options.signal?.aborted) return onAbort();
      options.signal?.addEventListener('abort', onAbort, { once: true });
      this.listener.ref();
      try {
        if (offer) this.listener.expect(nonce, offer.header, offer.fds);
        else this.listener.expect(nonce);
      } catch (err) {
        finish();
        reject(toVsnapError(err));
      }
    });
    return { nonce, message };
  }

  /**
   * Stops listening and removes the socket; pending expectations reject with E_CLOSED and pending
   * offers are withdrawn (their duplicated descriptors closed).
   */
  close(): void {
    if (this.closed) return;
    // Withdraw every pending offer first: the listener holds duplicates of the offered descriptors,
    // and once it is closed nothing could close them any more.
    for (const nonce of this.pending.keys()) this.listener.forget(nonce);
    this.closed = true;
    this.listener.close();
    for (const p of [...this.pending.values()]) p.reject(new VsnapError('E_CLOSED', 'the FdReceiver was closed'));
    if (this.ownedDir) rmSync(this.ownedDir, { recursive: true, force: true });
  }

  /** Same as {@link FdReceiver.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  private onEvent(event: NativeFdEvent): void {
    if (event.type === 'reject') {
      this.rejections.push(`pid ${event.pid}: ${event.reason}`);
      if (this.rejections.length > 20) this.rejections.shift();
      return;
    }
    const waiter = this.pending.get(event.nonce);
    if (!waiter) {
      for (const fd of event.fds) closeSync(fd);
      return;
    }
    let header: unknown;
    try {
      header = JSON.parse(event.header);
    } catch {
      for (const fd of event.fds) closeSync(fd);
      waiter.reject(new VsnapError('E_IPC_PROTOCOL', `pid ${event.pid} sent a header that is not JSON`));
      return;
    }
    waiter.resolve({ header, fds: event.fds, pid: event.pid });
  }
}

/**
 * Sends a JSON header and descriptors to an {@link FdReceiver} (the Node side of the protocol;
 * peers in Python use `socket.send_fds`). The descriptors stay open here.
 * @public
 */
export async function sendFds(
  path: string,
  nonce: string,
  header: unknown,
  fds: readonly number[],
  options: { timeoutMs?: number } = {},
): Promise<void> {
  const got = await exchange(path, nonce, header, fds, options.timeoutMs ?? 10_000);
  for (const fd of got.fds) closeSync(fd);
}

/**
 * Fetches what an {@link FdReceiver.offer} offers under `nonce`: its JSON header and the
 * descriptors (the caller owns them). `header` goes to the receiver as the request.
 * @public
 */
export async function fetchFds(path: string, nonce: string, header: unknown = {}, options: { timeoutMs?: number } = {}): Promise<{ offer: unknown; fds: number[] }> {
  const got = await exchange(path, nonce, header, [], options.timeoutMs ?? 10_000);
  if (got.offer === undefined) {
    for (const fd of got.fds) closeSync(fd);
    throw new VsnapError('E_IPC_PROTOCOL', `${path} offered nothing under that nonce`, { path });
  }
  return { offer: got.offer, fds: got.fds };
}

async function exchange(path: string, nonce: string, header: unknown, fds: readonly number[], timeoutMs: number): Promise<{ offer?: unknown; fds: number[] }> {
  let answer: { reply: string; fds: number[] };
  try {
    answer = await native().sendFds(path, nonce, JSON.stringify(header), fds, timeoutMs);
  } catch (err) {
    throw toVsnapError(err);
  }
  let parsed: { ok: boolean; code?: string; error?: string; offer?: unknown };
  try {
    parsed = JSON.parse(answer.reply) as typeof parsed;
  } catch {
    for (const fd of answer.fds) closeSync(fd);
    throw new VsnapError('E_IPC_PROTOCOL', `${path} replied with something that is not JSON`, { path });
  }
  if (!parsed.ok) {
    for (const fd of answer.fds) closeSync(fd);
    const code = parsed.code === 'E_IPC_AUTH' ? 'E_IPC_AUTH' : 'E_IPC_PROTOCOL';
    throw new VsnapError(code, `${path} refused the descriptors: ${parsed.error ?? 'no reason given'}`, { path });
  }
  return { ...(parsed.offer !== undefined ? { offer: parsed.offer } : {}), fds: answer.fds };
}
