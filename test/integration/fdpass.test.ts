import { execFile, spawn } from 'node:child_process';
import { chmodSync, closeSync, copyFileSync, existsSync, readdirSync, readSync, statSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { describe, expect, it } from 'vitest';

import { FdReceiver, sendFds } from '../../src/ipc/fd-receiver.js';
import { packageRoot } from '../../src/native/index.js';
import { HostRegion } from '../../src/regions/host-region.js';
import { tempDir } from '../helpers/tmp.js';

const pythonPeer = fileURLToPath(new URL('../fixtures/send_fds.py', import.meta.url));

function readFd(fd: number, length: number): string {
  const buf = Buffer.alloc(length);
  const n = readSync(fd, buf, 0, length, 0);
  return buf.subarray(0, n).toString().replace(/\0+$/, '');
}

describe('descriptor passing over the unix socket', () => {
  it('moves 600 memfds (three batches) and a JSON header; the memory is shared', async () => {
    await using receiver = await FdReceiver.listen();
    expect(statSync(receiver.path).mode & 0o777).toBe(0o600);
    expect(statSync(dirname(receiver.path)).mode & 0o777).toBe(0o700);
    const regions = Array.from({ length: 600 }, (_, i) => {
      const r = HostRegion.create(4096);
      r.write(0, Buffer.from(`region ${i}`));
      return r;
    });
    const { nonce, message } = receiver.expect();
    await sendFds(receiver.path, nonce, { rank: 0, regions: regions.map((r, i) => ({ key: `k${i}`, size: r.size })) }, regions.map((r) => r.fd));
    const got = await message;
    expect(got.pid).toBe(process.pid);
    expect((got.header as { regions: unknown[] }).regions).toHaveLength(600);
    expect(got.fds).toHaveLength(600);
    expect(readFd(got.fds[0]!, 64)).toBe('region 0');
    expect(readFd(got.fds[599]!, 64)).toBe('region 599');
    // same memory, not a copy: a write through the sender's side shows through the received fd
    regions[7]!.write(0, Buffer.from('changed!!'));
    expect(readFd(got.fds[7]!, 9)).toBe('changed!!');
    for (const fd of got.fds) closeSync(fd);
    for (const r of regions) r.close();
  });

  it('speaks the same protocol as a Python peer using socket.send_fds', async () => {
    await using receiver = await FdReceiver.listen();
    const { nonce, message } = receiver.expect();
    const [reply, got] = await Promise.all([
      promisify(execFile)('python3', [pythonPeer, receiver.path, nonce, '3']),
      message,
    ]);
    expect(JSON.parse(reply.stdout)).toEqual({ ok: true });
    expect(got.header).toMatchObject({ from: 'python' });
    expect(got.fds.map((fd) => readFd(fd, 64))).toEqual(['python region 0', 'python region 1', 'python region 2']);
    for (const fd of got.fds) closeSync(fd);
  });

  it('refuses a wrong or reused nonce, and says so in the timeout', async () => {
    await using receiver = await FdReceiver.listen();
    const r = HostRegion.create(4096);
    const { nonce, message } = receiver.expect(); // satisfied below (the default 30 s is only a bound)
    const wrong = 'f'.repeat(64);
    await expect(sendFds(receiver.path, wrong, {}, [r.fd])).rejects.toMatchObject({ code: 'E_IPC_AUTH' });
    await sendFds(receiver.path, nonce, { first: true }, [r.fd]);
    for (const fd of (await message).fds) closeSync(fd);
    await expect(sendFds(receiver.path, nonce, {}, [r.fd])).rejects.toMatchObject({ code: 'E_IPC_AUTH', message: expect.stringMatching(/already used/) });

    const rejections = (receiver as unknown as { rejections: string[] }).rejections;
    const before = rejections.length;
    await expect(sendFds(receiver.path, wrong, {}, [])).rejects.toMatchObject({ code: 'E_IPC_AUTH' });
    // the receiver records the refusal as it reports it (the sender may hear first); then a wait that times out says so
    while (rejections.length === before) await new Promise((r) => setTimeout(r, 10)); // the test's timeout bounds this
    const late = receiver.expect({ timeoutMs: 1 });
    await expect(late.message).rejects.toMatchObject({ code: 'E_TIMEOUT', message: expect.stringMatching(/unknown or already used nonce/) });
    r.close();
  });

  it('survives a peer that speaks garbage or hangs up, and keeps serving', async () => {
    await using receiver = await FdReceiver.listen();
    await new Promise<void>((resolve) => {
      const s = connect(receiver.path, () => s.end('GET / HTTP/1.1\r\n\r\n'));
      s.resume();
      s.on('close', () => resolve());
      s.on('error', () => resolve());
    });
    await new Promise<void>((resolve) => {
      const s = connect(receiver.path, () => s.destroy());
      s.on('close', () => resolve());
    });
    const r = HostRegion.create(4096);
    const { nonce, message } = receiver.expect();
    await sendFds(receiver.path, nonce, { ok: 1 }, [r.fd]);
    const got = await message;
    expect(got.header).toEqual({ ok: 1 });
    for (const fd of got.fds) closeSync(fd);
    r.close();
  });

  it.skipIf(process.getuid?.() !== 0)('rejects a peer of another uid (SO_PEERCRED), even past the file mode', async () => {
    await using receiver = await FdReceiver.listen(`${tempDir()}/fd.sock`);
    chmodSync(dirname(receiver.path), 0o755);
    chmodSync(receiver.path, 0o666); // only the credential check is left
    // A nonce for the peer, from an expectation ended by hand (a 3 s timeout that had to fire after
    // the refusal raced the peer's start on a busy machine)
    const waiting = new AbortController();
    const { nonce, message } = receiver.expect({ signal: waiting.signal });
    // The peer: this Node binary and the addon's own sender, run as nobody (uid 65534). It gets
    // its own copy of the addon in a directory it can enter: the checkout may sit where other
    // users cannot (a clean clone under `mktemp -d` is mode 0700).
    const prebuilt = join(packageRoot(), 'prebuilds', `linux-${process.arch}`);
    const shared = tempDir('vsnap-peer-');
    chmodSync(shared, 0o755);
    const addon = join(shared, 'vsnap.node');
    copyFileSync(join(prebuilt, readdirSync(prebuilt).find((f) => f.endsWith('.node'))!), addon);
    chmodSync(addon, 0o644);
    const script = `require(${JSON.stringify(addon)}).sendFds(${JSON.stringify(receiver.path)}, ${JSON.stringify(nonce)}, '{}', [0]).then((r) => console.log(r.reply), (e) => console.log(JSON.stringify({ failed: e.message })))`;
    const peer = spawn(process.execPath, ['-e', script], { uid: 65534, gid: 65534, cwd: '/' });
    let out = '';
    let err = '';
    peer.stdout.on('data', (d: Buffer) => (out += d.toString()));
    peer.stderr.on('data', (d: Buffer) => (err += d.toString()));
    await new Promise((resolve) => peer.on('exit', resolve));
    expect(out.trim(), `peer stderr: ${err}`).not.toBe('');
    expect(JSON.parse(out)).toMatchObject({ ok: false, code: 'E_IPC_AUTH' });
    // the receiver records the refusal as it reports it; once it has, a wait that times out says so
    const rejections = (receiver as unknown as { rejections: string[] }).rejections;
    while (!rejections.some((r) => /uid 65534/.test(r))) await new Promise((r) => setTimeout(r, 10)); // the test's timeout bounds this
    const late = receiver.expect({ timeoutMs: 1 });
    await expect(late.message).rejects.toMatchObject({ code: 'E_TIMEOUT', message: expect.stringMatching(/uid 65534/) });
    waiting.abort();
    await expect(message).rejects.toMatchObject({ code: 'E_ABORTED' });
  });

  it('closing removes the socket (and its private directory) and rejects what is pending', async () => {
    const receiver = await FdReceiver.listen();
    const { message } = receiver.expect();
    const path = receiver.path;
    receiver.close();
    await expect(message).rejects.toMatchObject({ code: 'E_CLOSED' });
    expect(existsSync(path)).toBe(false);
    expect(existsSync(dirname(path))).toBe(false);
    expect(() => receiver.expect()).toThrowError(expect.objectContaining({ code: 'E_CLOSED' }));
  });

  it('refuses to take over a socket another process listens on', async () => {
    await using first = await FdReceiver.listen(`${tempDir()}/fd.sock`);
    await expect(FdReceiver.listen(first.path)).rejects.toMatchObject({ code: 'E_ADDRESS_IN_USE' });
  });
});

describe('offering descriptors (the receiver hands them out)', () => {
  it('a peer fetches what was offered under its nonce, once; the offerer keeps its own', async () => {
    const { fetchFds } = await import('../../src/ipc/fd-receiver.js');
    await using receiver = await FdReceiver.listen();
    const regions = Array.from({ length: 300 }, (_, i) => {
      const r = HostRegion.create(4096);
      r.write(0, Buffer.from(`offered ${i}`));
      return r;
    });
    const { nonce, taken } = receiver.offer({ regions: regions.map((_, i) => ({ i })) }, regions.map((r) => r.fd));
    const got = await fetchFds(receiver.path, nonce, { rank: 0 });
    expect((got.offer as { regions: unknown[] }).regions).toHaveLength(300);
    expect(got.fds).toHaveLength(300);
    expect(readFd(got.fds[299]!, 64)).toBe('offered 299');
    expect((await taken).header).toEqual({ rank: 0 });
    await expect(fetchFds(receiver.path, nonce)).rejects.toMatchObject({ code: 'E_IPC_AUTH' });
    regions[5]!.write(0, Buffer.from('changed!!'));
    expect(readFd(got.fds[5]!, 9)).toBe('changed!!'); // the same memory
    for (const fd of got.fds) closeSync(fd);
    for (const r of regions) r.close();
  });
});
