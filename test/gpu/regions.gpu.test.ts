// GPU suite (device only): `npm run test:gpu`. A peer process owns >= 4 GiB of exportable GPU
// memory in regions of several sizes; vsnap imports it over the socket, captures it, the peer
// wipes it, vsnap hydrates it back, and the peer checks every byte.
import assert from 'node:assert/strict';
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { chmodSync, closeSync, mkdtempSync, openSync, readSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface, type Interface } from 'node:readline';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

import { cudaStatus, RamTier, RegionStore, Snapshot, VsnapError } from '../../src/index.js';
import { DeviceAllocation, FdReceiver, listDevices, releaseIdleResources } from '../../src/plumbing.js';
import { native } from '../../src/native/index.js';
import { gpuMemoryOf } from './nvidia-smi.js';

const MiB = 1024 * 1024;

const GiB = 1024 * MiB;
// 4.5 GiB in six regions of different sizes (multiples of the 2 MiB VMM granularity).
const SIZES = [2 * GiB, GiB, 512 * MiB, 514 * MiB, 258 * MiB, 2 * MiB];
const peerScript = process.env.VSNAP_GPU_PEER ?? fileURLToPath(new URL('./peer.mjs', import.meta.url));

class Peer {
  private readonly lines: Interface;
  private readonly queue: string[] = [];
  private waiter: ((line: string) => void) | undefined;
  constructor(readonly proc: ChildProcessWithoutNullStreams) {
    this.lines = createInterface({ input: proc.stdout });
    this.lines.on('line', (line) => {
      if (this.waiter) {
        const w = this.waiter;
        this.waiter = undefined;
        w(line);
      } else this.queue.push(line);
    });
    proc.stderr.on('data', (d: Buffer) => process.stderr.write(`[peer] ${d}`));
  }
  next(): Promise<string> {
    const queued = this.queue.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    return new Promise((resolve) => (this.waiter = resolve));
  }
  async ask(cmd: string): Promise<string> {
    this.proc.stdin.write(`${cmd}\n`);
    return this.next();
  }
}

describe('GPU: capture and hydrate another process\'s exported GPU memory', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }
  let receiver: FdReceiver;
  let peer: Peer;
  let fds: readonly number[];
  let regions: Array<{ key: string; size: number }>;
  let store: RegionStore;
  let storeDir: string;

  before(async () => {
    storeDir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-'));
    store = await RegionStore.open(storeDir);
    receiver = await FdReceiver.listen();
    const { nonce, message } = receiver.expect({ timeoutMs: 120_000 });
    const proc = spawn(process.execPath, [peerScript, receiver.path, nonce, SIZES.join(',')], { stdio: ['pipe', 'pipe', 'pipe'] });
    peer = new Peer(proc);
    const got = await message;
    fds = got.fds;
    regions = (got.header as { regions: Array<{ key: string; size: number }> }).regions;
    assert.equal(await peer.next(), 'sent');
  });

  after(async () => {
    if (peer && peer.proc.exitCode === null) {
      const exited = new Promise((resolve) => peer.proc.on('exit', resolve));
      peer.proc.stdin.write('exit\n');
      const timer = setTimeout(() => peer.proc.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    for (const fd of fds ?? []) closeSync(fd);
    receiver?.close();
    rmSync(storeDir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  const memory = () => regions.map((r, i) => ({ key: r.key, size: r.size, memory: { kind: 'imported' as const, fd: fds[i]! } }));

  it('captures 4.5 GiB from imported handles, restores it after a wipe, every byte identical', async () => {
    const t0 = performance.now();
    const snap = await Snapshot.capture(store, 'peer', { regions: memory(), model: { id: 'gpu-test/pattern' } });
    const capture = snap.lastCapture!;
    console.log(`capture: ${(capture.bytes / GiB).toFixed(2)} GiB in ${capture.seconds.toFixed(3)} s (${(capture.bytesPerSecond / 1e9).toFixed(2)} GB/s; ${((performance.now() - t0) / 1000).toFixed(2)} s with publish)`);
    assert.equal(snap.manifest.data.platform.kind, 'cuda');
    assert.equal(snap.manifest.data.ranks[0]!.device?.uuid, (await listDevices())[0]!.uuid);
    assert.equal(await peer.ask('wipe 0'), 'wiped');
    assert.equal(await peer.ask('check-byte 0'), 'byte ok');
    const restored = await snap.restore({ regions: memory() });
    console.log(`hydrate (page cache): ${(restored.bytes / GiB).toFixed(2)} GiB in ${restored.seconds.toFixed(3)} s (${(restored.bytesPerSecond / 1e9).toFixed(2)} GB/s)`);
    assert.equal(await peer.ask('check-pattern'), 'pattern ok');
    const direct = await snap.restore({ regions: memory(), directIo: true });
    console.log(`hydrate (O_DIRECT): ${(direct.bytesPerSecond / 1e9).toFixed(2)} GB/s`);
    assert.equal(await peer.ask('check-pattern'), 'pattern ok');
  });

  it('restores through the pinned RAM tier: loaded and verified once, then a bulk DMA', async () => {
    const snap = await Snapshot.open(store, 'peer');
    const cache = await RamTier.create({ budgetBytes: 5 * GiB });
    try {
      assert.equal(cache.pinned, true);
      assert.equal(await peer.ask('wipe 0'), 'wiped');
      const first = await snap.restore({ regions: memory(), ram: cache });
      assert.equal(first.tier, 'store');
      assert.equal(await peer.ask('check-pattern'), 'pattern ok');
      assert.equal(await peer.ask('wipe 0'), 'wiped');
      const second = await snap.restore({ regions: memory(), ram: cache });
      assert.equal(second.tier, 'ram');
      console.log(`hydrate (RAM tier): ${(second.bytes / GiB).toFixed(2)} GiB in ${second.seconds.toFixed(3)} s (${(second.bytesPerSecond / 1e9).toFixed(2)} GB/s)`);
      assert.equal(await peer.ask('check-pattern'), 'pattern ok');
    } finally {
      cache.close();
    }
  });

  it("captures into the pinned RAM tier (persist 'async'): the GPU memory is free to go when capture resolves", async () => {
    const cache = await RamTier.create({ budgetBytes: 5 * GiB });
    try {
      const snap = await Snapshot.capture(store, 'peer-ram', { regions: memory(), ram: cache, persist: 'async' });
      const c = snap.lastCapture!;
      console.log(`capture to RAM tier: ${(c.bytes / GiB).toFixed(2)} GiB in ${c.seconds.toFixed(3)} s (${(c.bytesPerSecond / 1e9).toFixed(2)} GB/s); durable at return: ${snap.durable}`);
      assert.equal(await peer.ask('wipe 0'), 'wiped');
      const restored = await snap.restore({ regions: memory(), ram: cache });
      assert.equal(restored.tier, 'ram');
      assert.equal(await peer.ask('check-pattern'), 'pattern ok');
      const p0 = performance.now();
      await snap.persist();
      console.log(`persistence (in the background since capture returned) needed ${((performance.now() - p0) / 1000).toFixed(2)} s more after the restore and check`);
      const sync = await Snapshot.open(store, 'peer');
      assert.deepEqual(
        [...snap.manifest.regions()].map((r) => r.region.blob),
        [...sync.manifest.regions()].map((r) => r.region.blob),
        'the same bytes as the sync capture: the same blobs',
      );
      assert.equal((await snap.verify()).ok, true);
    } finally {
      cache.close();
    }
  });

  it('a corrupted blob puts no byte on the GPU (all-first), and not the bad chunk (chunk mode)', async () => {
    const snap = await Snapshot.open(store, 'peer');
    const target = [...snap.manifest.regions()].find((r) => r.region.size === 512 * MiB)!.region;
    const path = store.blobPath(target.blob);
    chmodSync(path, 0o644);
    const fd = openSync(path, 'r+');
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, 300 * MiB);
    writeSync(fd, Buffer.from([b[0]! ^ 1]), 0, 1, 300 * MiB);
    closeSync(fd);

    assert.equal(await peer.ask('wipe 90'), 'wiped');
    await assert.rejects(snap.restore({ regions: memory(), verify: 'all-first' }), (err: VsnapError) => {
      assert.equal(err.code, 'E_CHECKSUM');
      assert.equal(err.details.region, target.key);
      assert.equal(err.details.chunk, 4);
      return true;
    });
    assert.equal(await peer.ask('check-byte 90'), 'byte ok', 'device memory must be untouched');

    await assert.rejects(snap.restore({ regions: memory() }), { code: 'E_CHECKSUM' });
    const report = await store.verify('peer');
    assert.equal(report.ok, false);
    assert.deepEqual(report.problems.map((p) => p.region), [target.key]);
  });
});

describe('GPU: own allocations, devices, and context lifetime', async () => {
  const status = await cudaStatus();
  if (!status.available) {
    it('needs a GPU', () => assert.fail(`this suite needs an NVIDIA GPU: ${status.reason}`));
    return;
  }

  it('reports devices with VMM granularity and POSIX-FD support', async () => {
    const [d] = await listDevices({ freeMemory: true });
    assert.ok(d);
    assert.match(d.uuid, /^GPU-[0-9a-f-]{36}$/);
    assert.ok(d.vmmSupported && d.posixFdHandlesSupported);
    assert.ok(d.vmmGranularity > 0 && d.freeMemory! > 0 && d.totalMemory >= d.freeMemory!);
    console.log(`device: ${d.name} cc ${d.computeCapability}, granularity ${d.vmmGranularity}, driver CUDA ${status.driverVersion}, checkpoint API ${status.checkpointApi}`);
  });

  it('moves regions spread over two GPUs at once (RAM tier and store), every byte identical', { skip: (await listDevices()).length < 2 && 'one GPU' }, async () => {
    const dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-multi-'));
    const store = await RegionStore.open(dir);
    const sizes = [GiB, GiB, 512 * MiB, 512 * MiB, 258 * MiB, 258 * MiB];
    const allocations = await Promise.all(sizes.map((size, i) => DeviceAllocation.allocate(i % 2, size)));
    const fill = (i: number): number => (i * 37 + 11) & 0xff;
    const cache = await RamTier.create({ budgetBytes: 4 * GiB });
    try {
      for (const [i, a] of allocations.entries()) {
        await a.fill(0, a.size, fill(i));
        await a.write(a.size - 9, Buffer.from(`region ${i}`.padEnd(9)));
      }
      const regions = allocations.map((a, i) => ({ key: `r${i}`, rank: i % 2, size: a.size, memory: { kind: 'device' as const, allocation: a } }));
      const snap = await Snapshot.capture(store, 'two-gpus', { regions, ram: cache });
      assert.deepEqual(snap.manifest.data.ranks.map((r) => r.device?.uuid), (await listDevices()).slice(0, 2).map((d) => d.uuid));
      const check = async (): Promise<void> => {
        for (const [i, a] of allocations.entries()) {
          assert.ok((await a.read(0, MiB)).equals(Buffer.alloc(MiB, fill(i))), `region ${i} start`);
          assert.equal((await a.read(a.size - 9, 9)).toString(), `region ${i}`.padEnd(9));
        }
      };
      const wipe = async (): Promise<void> => {
        for (const a of allocations) await a.fill(0, a.size, 0);
      };
      const rows: string[] = [`capture ${(snap.lastCapture!.bytesPerSecond / 1e9).toFixed(2)} GB/s`];
      for (const via of ['ram', 'store'] as const) {
        await wipe();
        const r = await snap.restore({ regions, ...(via === 'ram' ? { ram: cache } : {}) });
        assert.equal(r.tier, via);
        await check();
        rows.push(`restore from ${via} ${(r.bytesPerSecond / 1e9).toFixed(2)} GB/s`);
      }
      console.log(`two GPUs, ${(snap.manifest.totalBytes / GiB).toFixed(2)} GiB: ${rows.join(', ')}`);
    } finally {
      cache.close();
      for (const a of allocations) a.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a set of allocations made together: side by side, separate, each exportable; a fault at each step leaves nothing allocated', async () => {
    const free = async (): Promise<number> => (await listDevices({ freeMemory: true }))[0]!.freeMemory!;
    const sizes = [6 * MiB, 2 * MiB + 1, 64 * MiB];
    const total = 74 * MiB;
    const before = await free();
    const set = await DeviceAllocation.allocateSet(0, sizes);
    try {
      assert.deepEqual(set.map((a) => a.size), [6 * MiB, 4 * MiB, 64 * MiB]);
      // one reservation: the regions lie side by side
      assert.equal(set[1]!.address, set[0]!.address + BigInt(set[0]!.size));
      assert.equal(set[2]!.address, set[1]!.address + BigInt(set[1]!.size));
      assert.ok((await free()) <= before - total, 'the set holds its memory');
      for (const [i, a] of set.entries()) await a.fill(0, a.size, 0x10 + i);
      for (const [i, a] of set.entries()) {
        const edges = Buffer.concat([await a.read(0, 4096), await a.read(a.size - 4096, 4096)]);
        assert.ok(edges.equals(Buffer.alloc(8192, 0x10 + i)), `region ${i} holds its own bytes`);
      }
      // each exports its own memory: a peer's import holds it
      const fds = set.map((a) => a.exportFd());
      try {
        const held = await native().holdHandles(fds);
        held.close();
      } finally {
        for (const fd of fds) closeSync(fd);
      }
    } finally {
      for (const a of set) a.close();
    }
    assert.ok((await free()) >= before - 2 * MiB, 'closing every allocation of the set frees its memory');
    for (const point of ['map-reserve', 'map-map', 'map-access'] as const) {
      native().setFault(point, 1);
      try {
        await assert.rejects(DeviceAllocation.allocateSet(0, sizes), (err: Error) => /injected fault/.test(err.message));
      } finally {
        native().setFault(point, 0);
      }
      assert.ok((await free()) >= before - 2 * MiB, `a fault at ${point} leaves nothing allocated`);
    }
  });

  it('a copy queue lands batches into device memory in order, every byte; a failed copy or a cancel leaves nothing in flight or allocated', async () => {
    const free = async (): Promise<number> => (await listDevices({ freeMemory: true }))[0]!.freeMemory!;
    const before = await free();
    const sizes = [256 * MiB, 130 * MiB, 2 * MiB];
    const total = sizes.reduce((n, x) => n + x, 0);
    const offsets = sizes.map((_, i) => sizes.slice(0, i).reduce((n, x) => n + x, 0));
    // the RAM-tier source: pinned, filled through a capture from device memory (region i holds byte 0x21 + i, its last 9 bytes its name)
    const source = await native().createHostBuffer(total, 0);
    const filler = await DeviceAllocation.allocate(0, total);
    const targets = await Promise.all(sizes.map((size) => DeviceAllocation.allocate(0, size)));
    try {
      for (const [i, size] of sizes.entries()) {
        await filler.fill(offsets[i]!, size, 0x21 + i);
        await filler.write(offsets[i]! + size - 9, Buffer.from(`region ${i}`.padEnd(9)));
      }
      await native().startTransfer({ op: 'capture', label: 'fill', hash: false, regions: [{ name: 'all', size: total, chunkSize: 64 * MiB, memory: { kind: 'device', allocation: filler.handle }, hostCopy: { kind: 'buffer', buffer: source, offset: 0 } }] }).promise;
      const region = (i: number) => ({ name: `r${i}`, size: sizes[i]!, chunkSize: 64 * MiB, memory: { kind: 'device' as const, allocation: targets[i]! }, hostCopy: { kind: 'buffer' as const, buffer: source, offset: offsets[i]! } });
      const wipe = async (): Promise<void> => {
        for (const t of targets) await t.fill(0, t.size, 0);
      };
      const holds = async (i: number): Promise<boolean> => {
        const t = targets[i]!;
        return (await t.read(0, MiB)).equals(Buffer.alloc(MiB, 0x21 + i)) && (await t.read(t.size - 9, 9)).toString() === `region ${i}`.padEnd(9);
      };
      const { CopyQueue } = await import('../../src/transfer/copy-queue.js');
      // in order, every byte
      await wipe();
      const q = CopyQueue.open('gpu-order');
      const [a, b] = await Promise.all([q.push([region(0)]), q.push([region(1), region(2)])]);
      await q.close();
      assert.equal(a.bytes + b.bytes, total);
      assert.ok(a.landedAt <= b.landedAt, 'the second batch lands after the first');
      assert.deepEqual(b.devices, [{ device: 0, bytes: sizes[1]! + sizes[2]! }]);
      for (let i = 0; i < sizes.length; i++) assert.ok(await holds(i), `region ${i} copied`);
      console.log(`copy queue: ${(total / MiB).toFixed(0)} MiB landed in ${((b.landedAt - a.issuedAt) * 1000).toFixed(1)} ms (${(total / (b.landedAt - a.issuedAt) / 1e9).toFixed(2)} GB/s)`);
      // a copy the driver refuses (injected): that batch and the later ones fail, the earlier landed
      await wipe();
      const f = CopyQueue.open('gpu-fail');
      native().setFault('copy-fail', 1, 4); // region 0's four chunks copy, region 1's first fails
      try {
        const ok = f.push([region(0)]);
        const bad = f.push([region(1)]);
        const later = f.push([region(2)]);
        await ok;
        await assert.rejects(bad, (err: VsnapError) => err.code === 'E_CUDA' && /injected fault/.test(err.message));
        await assert.rejects(later, (err: VsnapError) => err.code === 'E_CUDA');
      } finally {
        native().setFault('copy-fail', 0);
        await f.close();
      }
      assert.ok(await holds(0));
      assert.ok(!(await holds(2)), 'nothing copied after the failure');
      // a cancel while the copies run: what is left rejects once nothing is in flight
      native().setFault('chunk-delay', 1000, 20);
      const c = CopyQueue.open('gpu-cancel');
      try {
        const running = c.push([region(0), region(1)]);
        c.cancel();
        await assert.rejects(running, (err: VsnapError) => err.code === 'E_ABORTED');
      } finally {
        native().setFault('chunk-delay', 0);
        await c.close();
      }
    } finally {
      for (const t of targets) t.close();
      filler.close();
      source.close();
    }
    assert.ok((await free()) >= before - 2 * MiB, 'every allocation freed');
  });

  it('round-trips DeviceAllocations in this process and lets go of the context when idle', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'vsnap-gpu-own-'));
    const store = await RegionStore.open(dir);
    const a = await DeviceAllocation.allocate(0, 64 * MiB + 1);
    assert.equal(a.size, 66 * MiB);
    await a.write(0, Buffer.alloc(a.size, 7));
    await a.write(MiB, Buffer.from('hello gpu'));
    const snap = await Snapshot.capture(store, 'own', { regions: [{ key: 'a', size: a.size, memory: { kind: 'device', allocation: a } }] });
    await a.fill(0, a.size, 0);
    await snap.restore({ regions: [{ key: 'a', size: a.size, memory: { kind: 'device', allocation: a } }] });
    assert.equal((await a.read(MiB, 9)).toString(), 'hello gpu');
    assert.ok((await a.read(0, MiB)).equals(Buffer.alloc(MiB, 7)));
    assert.equal(native().cudaHoldsContext(0), true);
    console.log(`GPU memory of this process while working (66 MiB allocated): ${gpuMemoryOf(process.pid)} MiB`);
    a.close();
    await releaseIdleResources();
    assert.equal(native().cudaHoldsContext(0), false, 'no CUDA context held once idle');
    console.log(`GPU memory of this process when idle: ${gpuMemoryOf(process.pid) ?? 0} MiB`);
    rmSync(dir, { recursive: true, force: true });
  });
});
