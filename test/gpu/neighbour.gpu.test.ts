// GPU suite, the neighbour-GPU tier (two GPUs; skipped with the reason otherwise): an engine's
// regions on GPU 0 parked in GPU 1's memory and restored by peer copy, verified by GPU digest
// against the manifest, against a raw peer copy of the same bytes in the same run.
// Prints one parseable line: NEIGHBOUR gib=... restore_gbps=... raw_peer_gbps=... ratio=...
// Then the tier inside the engine flows and the SwapController, with the CUDA reference engine on
// GPU 0: suspendEngine parks before the sleep, restoreEngine hydrates from GPU 1 (report tier
// `neighbour`), a swap A→B→A restores A from the neighbour. Prints
// NEIGHBOUR_ENGINE bytes=... park_ms=... hydrate_gbps=... tier=neighbour answer=identical
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { captureEngine, cudaStatus, EngineClient, RamTier, NeighbourTier, RegionStore, restoreEngine, Snapshot, suspendEngine, SwapController, type SwapEvent } from '../../src/index.js';
import { DeviceAllocation, listDevices, releaseIdleResources } from '../../src/plumbing.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { native } from '../../src/native/index.js';
import { canAccessPeer } from '../../src/transfer/multipath.js';

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const median = (v: number[]): number => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;

async function missing(): Promise<string | undefined> {
  const status = await cudaStatus();
  if (!status.available) return `needs two NVIDIA GPUs: ${status.reason}`;
  const n = (await listDevices()).length;
  if (n < 2) return `needs two GPUs, this machine has ${n}`;
  if (!canAccessPeer(0, 1)) return 'GPU 0 cannot access GPU 1 directly (no NVLink or PCIe peer-to-peer)';
  return undefined;
}

describe('GPU: the neighbour-GPU tier', async () => {
  const why = await missing();
  if (why) {
    it('needs two GPUs with peer access', { skip: why }, () => {});
    return;
  }
  const gib = Number(process.env.VSNAP_GPU_NEIGHBOUR_GIB ?? 8);
  const parts = 4;
  let dir: string;
  let cache: RamTier;
  let regions: DeviceAllocation[] = [];
  let snap: Snapshot;
  const live = () => regions.map((a, i) => ({ key: `layer.${i}`, size: a.size, memory: { kind: 'device' as const, allocation: a } }));

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-neighbour-'));
    const store = await RegionStore.open(dir);
    const piece = randomBytes(64 * MiB);
    let n = 0;
    for (let i = 0; i < parts; i++) {
      const a = await DeviceAllocation.allocate(0, (gib * GiB) / parts);
      regions.push(a);
      for (let off = 0; off < a.size; off += piece.length) {
        piece.writeUInt32LE(n++, 0);
        await a.write(off, piece);
      }
    }
    cache = await RamTier.create({ budgetBytes: gib * GiB + GiB });
    snap = await Snapshot.capture(store, 'nb', { regions: live(), ram: cache, persist: 'off' }); // the manifest with GPU digests
  });
  after(async () => {
    for (const a of regions) a.close();
    regions = [];
    cache?.close();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it(`parks ${gib} GiB on GPU 1 and restores it onto GPU 0 by peer copy, verified, against a raw peer copy`, async () => {
    const tier = NeighbourTier.create({ device: 1, budgetBytes: gib * GiB + GiB });
    try {
      const parked = await tier.park(snap.id, live(), { manifest: snap.manifest });
      assert.equal(tier.usedBytes, gib * GiB);
      const restores: number[] = [];
      for (let rep = 0; rep < 5; rep++) {
        for (const a of regions) await a.fill(0, a.size, 0); // the engine's memory after a sleep: nothing of the weights left
        const r = await tier.restore(snap.id, live(), { manifest: snap.manifest });
        assert.ok(r.digestSeconds !== undefined, 'restored memory verified by GPU digest');
        restores.push(r.bytesPerSecond);
      }
      // The raw peer copy: the same bytes, GPU 1 -> GPU 0, on a stream of GPU 0, outside the tier.
      const a = await DeviceAllocation.allocate(1, gib * GiB);
      const b = await DeviceAllocation.allocate(0, gib * GiB);
      let raw: number[];
      try {
        const t = await native().peerCopy({ device: 0, pairs: [{ src: { kind: 'device', allocation: a.handle }, dst: { kind: 'device', allocation: b.handle }, size: gib * GiB }], repeats: 5 });
        raw = t.copySeconds.map((s) => (gib * GiB) / s);
      } finally {
        a.close();
        b.close();
      }
      const gb = (v: number) => (v / 1e9).toFixed(1);
      console.log(`park ${gb(parked.bytesPerSecond)} GB/s; restores ${restores.map(gb).join(', ')} GB/s; raw peer copy ${raw.map(gb).join(', ')} GB/s`);
      console.log(
        `NEIGHBOUR gib=${gib} park_gbps=${gb(parked.bytesPerSecond)} restore_gbps=${gb(median(restores))} raw_peer_gbps=${gb(median(raw))} ` +
          `ratio=${(median(restores) / median(raw)).toFixed(2)} verified=yes`,
      );
    } finally {
      tier.close();
    }
    assert.equal(tier.usedBytes, 0);
  });

  it('refuses what does not fit its budget (nothing allocated), detects a corrupted parked copy, and frees on evict/close', async () => {
    const small = NeighbourTier.create({ device: 1, budgetBytes: GiB });
    await assert.rejects(small.park('x', live()), { code: 'E_NO_SPACE' });
    assert.equal(small.usedBytes, 0);
    small.close();
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 2 * gib * GiB });
    try {
      await tier.park('m', live());
      await regions[1]!.fill(0, MiB, 0xff); // the engine's memory damaged after the park
      await tier.restore('m', live(), { manifest: snap.manifest }); // the parked copy is intact: restore repairs it
      await tier.park('bad', live().slice(0, 1)); // a second holding, then evict it
      assert.equal(tier.evict('bad'), true);
      await regions[2]!.fill(0, MiB, 0xff);
      // weights that differ from the snapshot are not kept
      await assert.rejects(tier.park('stale', live().slice(2, 3), { manifest: snap.manifest }), { code: 'E_DIGEST_MISMATCH' });
      assert.equal(tier.has('stale'), false);
      assert.equal(tier.usedBytes, gib * GiB);
    } finally {
      tier.close();
    }
    assert.equal(tier.usedBytes, 0);
    await assert.rejects(tier.restore('m', live()), { code: 'E_CLOSED' });
  });

  it('restoreEngine and the SwapController: parked before the sleep, restored from GPU 1, same answer', async () => {
    const engines: Array<{ e: TestEngine; c: EngineClient; expected: number[] | null }> = [];
    const store = await RegionStore.open(join(dir, 'engines'));
    const tier = NeighbourTier.create({ device: 1, budgetBytes: 16 * GiB });
    try {
      for (const seed of [1, 2]) {
        // VSNAP_GPU_NEIGHBOUR_ENGINE_ARGS (e.g. "--layers 36 --hidden 4096") for a larger model, where the bandwidth means more
        const args = process.env.VSNAP_GPU_NEIGHBOUR_ENGINE_ARGS?.split(/\s+/).filter(Boolean) ?? ['--layers', '18', '--hidden', '2048'];
        const e = await startEngine({ device: 'cuda', seed, model: `nb${seed}`, args, startTimeoutMs: 400_000 });
        const c = new EngineClient({ baseUrl: e.url, token: e.token });
        engines.push({ e, c, expected: (await askCapital(c, 16)).ids });
        await captureEngine(store, `nb${seed}`, c);
      }
      const [a, b] = engines as [(typeof engines)[0], (typeof engines)[0]];
      const warnings: string[] = [];
      const onWarning = (m: string) => warnings.push(m);
      const suspended = await suspendEngine(store, 'nb1', a.c, { onWarning, tiers: { neighbour: tier } });
      assert.ok(suspended.parked, `parked (${warnings.join('; ')})`);
      const report = await restoreEngine(suspended.snapshot, a.c, { onWarning, tiers: { neighbour: tier } });
      assert.equal(report.tier, 'neighbour', warnings.join('; '));
      assert.ok(report.phases.verifyDigests !== undefined, 'verified by GPU digest');
      assert.deepEqual((await askCapital(a.c, 16)).ids, a.expected);
      const gbps = report.bytes / report.phases.hydrate! / 1e9;
      console.log(`NEIGHBOUR_ENGINE bytes=${report.bytes} park_ms=${(suspended.parked.seconds * 1000).toFixed(1)} hydrate_gbps=${gbps.toFixed(1)} tier=${report.tier} answer=identical`);

      // The controller: one of the two fits GPU 0's budget; A→B→A, A's second restore from GPU 1.
      const controller = await SwapController.create({
        store,
        engines: [
          { name: 'nb1', client: a.c, memoryBytes: 10 * GiB },
          { name: 'nb2', client: b.c, memoryBytes: 10 * GiB },
        ],
        budgets: { 0: 15 * GiB, 1: 100 * GiB },
        tiers: { neighbour: tier },
      });
      const swaps: SwapEvent[] = [];
      controller.on('swap', (e: SwapEvent) => swaps.push(e));
      try {
        for (const [name, x] of [['nb1', a], ['nb2', b], ['nb1', a]] as const) {
          const lease = await controller.acquire(name);
          try {
            assert.deepEqual((await askCapital(lease.client, 16)).ids, x.expected, name);
          } finally {
            lease.release();
          }
        }
      } finally {
        await controller.close();
      }
      const restores = swaps.filter((e) => e.action === 'restore');
      assert.equal(restores.at(-1)?.engine, 'nb1');
      assert.equal(restores.at(-1)?.tier, 'neighbour');
      assert.ok(controller.neighbour()!.usedBytes <= 16 * GiB);
    } finally {
      tier.close();
      for (const x of engines) {
        await x.c.close();
        await x.e.stop();
      }
    }
    assert.equal(tier.usedBytes, 0);
  });
});
