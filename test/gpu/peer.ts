// The "other process" of the GPU tests: owns exportable device memory, fills it with a seeded
// pattern, sends the FDs to the test over vsnap's socket, then obeys commands on stdin:
//   wipe <byte> | check-pattern | check-byte <byte> | exit
// Replies one line per command on stdout. argv: <socket> <nonce> <sizes, comma-separated>
import { createInterface } from 'node:readline';

import { DeviceAllocation, sendFds } from '../../src/plumbing.js';
import { patternBytes } from '../../src/cli/demo.js';

const [socket, nonce, sizesArg] = process.argv.slice(2) as [string, string, string];
const PIECE = 256 * 1024 * 1024;

const allocations: Array<{ key: string; alloc: DeviceAllocation }> = [];
for (const [i, s] of sizesArg.split(',').entries()) {
  allocations.push({ key: `model.layers.${i}.weight`, alloc: await DeviceAllocation.allocate(0, Number(s)) });
}

async function forEachPiece(fn: (a: DeviceAllocation, key: string, off: number, n: number) => Promise<boolean>): Promise<boolean> {
  for (const { key, alloc } of allocations) {
    for (let off = 0; off < alloc.size; off += PIECE) {
      if (!(await fn(alloc, key, off, Math.min(PIECE, alloc.size - off)))) return false;
    }
  }
  return true;
}

await forEachPiece(async (a, key, off, n) => (await a.write(off, patternBytes(key, off, n)), true));
const fds = allocations.map(({ alloc }) => alloc.exportFd());
await sendFds(socket, nonce, { pid: process.pid, regions: allocations.map(({ key, alloc }) => ({ key, size: alloc.size, device: alloc.device })) }, fds);
console.log('sent');

for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === 'wipe') {
    for (const { alloc } of allocations) await alloc.fill(0, alloc.size, Number(arg));
    console.log('wiped');
  } else if (cmd === 'check-pattern') {
    const ok = await forEachPiece(async (a, key, off, n) => (await a.read(off, n)).equals(patternBytes(key, off, n)));
    console.log(ok ? 'pattern ok' : 'pattern MISMATCH');
  } else if (cmd === 'check-byte') {
    const want = Number(arg);
    const ok = await forEachPiece(async (a, _key, off, n) => (await a.read(off, n)).equals(Buffer.alloc(n, want)));
    console.log(ok ? 'byte ok' : 'byte MISMATCH');
  } else if (cmd === 'exit') {
    break;
  }
}
for (const { alloc } of allocations) alloc.close();
process.exit(0); // stdin stays open behind readline; leave explicitly
