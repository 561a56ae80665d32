import { closeSync, readdirSync, writeSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { native, type NativeFdEvent, type NativeFdListener } from '../../src/native/index.js';
import { tempDir } from '../helpers/tmp.js';

// The native listener itself (native/ipc/fd_channel.cc), driven by hostile or broken peers.

function listen(deadlineMs?: number): { listener: NativeFdListener; events: NativeFdEvent[] } {
  const events: NativeFdEvent[] = [];
  const listener = new (native().FdListener)(join(tempDir(), 'fd.sock'), (e) => events.push(e), deadlineMs);
  return { listener, events };
}

function nonce(c: string): string {
  return c.repeat(64);
}

/** A raw peer: resolves with the reply JSON the listener sends, or null if it hangs up first. */
function rawPeer(path: string, onConnect: (s: Socket) => void): { socket: Socket; reply: Promise<{ ok: boolean; code?: string } | null> } {
  const socket = connect(path, () => onConnect(socket));
  const reply = new Promise<{ ok: boolean; code?: string } | null>((resolve) => {
    let buf = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length >= 4 && buf.length >= 4 + buf.readUInt32LE(0)) resolve(JSON.parse(buf.subarray(4, 4 + buf.readUInt32LE(0)).toString()));
    });
    socket.on('close', () => resolve(null));
    socket.on('error', () => resolve(null));
  });
  return { socket, reply };
}

function frame(n: string, header: string): Buffer {
  const h = Buffer.from(header);
  const sizes = Buffer.alloc(8);
  sizes.writeUInt32LE(h.length, 0);
  sizes.writeUInt32LE(0, 4);
  return Buffer.concat([Buffer.from('VSN1'), Buffer.from(n), sizes, h]);
}

/** Events come through a thread-safe function, a few turns of the loop later. */
async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((r) => setTimeout(r, 5));
}

function openFds(): number {
  return readdirSync('/proc/self/fd').length;
}

describe('the fd listener and its peers', () => {
  it('serves a second peer while an idle one is still connected, and cuts the idle one off at close', async () => {
    const { listener } = listen();
    let idleAnswered = false;
    // The idle peer's one write must be done before the listener closes: a write after that
    // fails with EPIPE, and Node then drops the socket before it reads the E_CLOSED reply.
    let wrote!: () => void;
    const written = new Promise<void>((r) => (wrote = r));
    const idle = rawPeer(listener.path, (s) => s.write('VSN1', () => wrote())); // then nothing
    void idle.reply.then(() => (idleAnswered = true));
    await written;
    listener.expect(nonce('b'));
    const { reply } = await native().sendFds(listener.path, nonce('b'), '{"second":true}', []);
    expect(JSON.parse(reply)).toEqual({ ok: true });
    expect(idleAnswered).toBe(false); // served concurrently, not after the idle peer timed out
    listener.close();
    expect(await idle.reply).toMatchObject({ ok: false, code: 'E_CLOSED' });
  });

  it('refuses connections beyond 32 at once with E_BUSY, and serves again once they end', async () => {
    const { listener } = listen();
    const idle = Array.from({ length: 32 }, () => rawPeer(listener.path, (s) => s.write('VSN1')));
    await Promise.all(idle.map((p) => new Promise((r) => (p.socket.connecting ? p.socket.once('connect', r) : r(null)))));
    // The listener accepts in order: the next peer is the 33rd connection in progress.
    const extra = rawPeer(listener.path, () => {});
    expect(await extra.reply).toMatchObject({ ok: false, code: 'E_BUSY' });
    for (const p of idle) p.socket.destroy();
    await Promise.all(idle.map((p) => p.reply));
    // A finished connection is marked done as its socket closes, and reaped before the next accept.
    listener.expect(nonce('g'));
    expect(JSON.parse((await native().sendFds(listener.path, nonce('g'), '{}', [])).reply)).toEqual({ ok: true });
    listener.close();
  });

  it('gives each connection a deadline: a peer that trickles bytes forever is cut off', async () => {
    const { listener, events } = listen(300);
    const bytes = frame(nonce('c'), '{}');
    let timer: NodeJS.Timeout | undefined;
    const slow = rawPeer(listener.path, (s) => {
      // Trickle through the raw descriptor: once the listener has answered and hung up, a write
      // fails with EPIPE, which through the Socket would drop it before it reads the answer.
      const fd = (s as unknown as { _handle: { fd: number } })._handle.fd;
      let i = 0;
      timer = setInterval(() => {
        try {
          writeSync(fd, bytes.subarray(i % bytes.length, (i++ % bytes.length) + 1));
        } catch {
          clearInterval(timer); // the listener hung up: its answer is waiting to be read
        }
      }, 20);
    });
    const got = await slow.reply;
    clearInterval(timer);
    slow.socket.destroy();
    expect(got).toMatchObject({ ok: false, code: 'E_TIMEOUT' });
    await until(() => events.some((e) => e.type === 'reject' && /within 300 ms/.test(e.reason)));
    listener.close();
  });

  it.each([
    ['not JSON', 'not json'],
    ['truncated JSON', '{"a":'],
    ['JSON that is not an object', '[1,2]'],
    ['an object with trailing junk', '{} x'],
  ])('refuses a header that is %s instead of answering ok', async (_what, header) => {
    const { listener, events } = listen();
    listener.expect(nonce('d'));
    const memfd = native().createMemfd('refused', 4096);
    const { reply, fds } = await native().sendFds(listener.path, nonce('d'), header, [memfd]);
    closeSync(memfd);
    expect(JSON.parse(reply)).toMatchObject({ ok: false, code: 'E_IPC_PROTOCOL' });
    expect(fds).toEqual([]);
    await until(() => events.length > 0);
    listener.close();
    expect(events).toEqual([expect.objectContaining({ type: 'reject', reason: 'the header is not a JSON object' })]);
  });

  it('accepts any JSON object header', async () => {
    const { listener, events } = listen();
    listener.expect(nonce('e'));
    const header = ' {"a":[1,-2.5e3,true,null,{"b":"\\u00e9\\n"}],"c":{}} ';
    expect(JSON.parse((await native().sendFds(listener.path, nonce('e'), header, [])).reply)).toEqual({ ok: true });
    await until(() => events.length > 0);
    listener.close();
    expect(events).toEqual([expect.objectContaining({ type: 'delivery', header })]);
    for (const fd of (events[0] as { fds: number[] }).fds) closeSync(fd);
  });

  it('closing closes the descriptors of offers nobody fetched', () => {
    const before = openFds();
    const { listener } = listen();
    const withListener = openFds();
    const offered = Array.from({ length: 5 }, (_, i) => native().createMemfd(`offer${i}`, 4096));
    listener.expect(nonce('f'), '{"offer":1}', offered);
    for (const fd of offered) closeSync(fd); // the listener holds its own duplicates
    expect(openFds()).toBe(withListener + 5);
    listener.close();
    expect(openFds()).toBe(before);
  });
});
