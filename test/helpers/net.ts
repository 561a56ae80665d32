import { connect, createServer, type Socket } from 'node:net';

/** A TCP port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

/** A raw connection: what came back, and when the peer closed it. */
export function raw(url: string): { socket: Socket; received: () => string; closed: Promise<void> } {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  socket.on('error', () => undefined);
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  return { socket, received: () => text, closed };
}

/** Waits for a condition the server reaches by itself (the test's timeout bounds it). */
export async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 10));
}

/** Polls `probe` until it gives a value, and returns it (the test's timeout bounds it). */
export async function probeUntil<T>(probe: () => Promise<T | undefined>): Promise<T> {
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Sends a completion whose answer (the prompt echoed, MiBs) the client never reads past its first bytes. */
export async function pausedReader(url: string, model: string): Promise<{ socket: Socket; closed: Promise<void> }> {
  const body = JSON.stringify({ model, prompt: 'x'.repeat(8 * 2 ** 20), max_tokens: 0, echo: true });
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  socket.on('error', () => undefined);
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  const first = new Promise<void>((resolve) => socket.once('data', () => resolve()));
  socket.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`);
  socket.write(body);
  await first;
  socket.pause(); // reads nothing more: the answer backs up into the server
  return { socket, closed };
}
