// GPU suite, restore onto another GPU (device only, two GPUs of the same kind, driver r580+): the
// reference engine deep-suspended on GPU 0, its process restored onto GPU 1 (pairs 0->1 and
// 1->0), its weights woken and hydrated there, the answer bit-identical, nvidia-smi listing the
// pid on GPU 1; and back. Then what the driver refuses: a lone pair, identity pairs (printed);
// the SDK's refusal of a GPU without room for the process or its weights (before any driver
// call); a checkpoint while the SDK holds exported descriptors of the engine; last, the raw
// driver's restore onto a full GPU (printed; it may leave the process unrestorable, so the
// engine is stopped after it).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { engineControl } from '../../src/engine/control.js';
import { exportRegions } from '../../src/engine/export.js';
import { captureEngine, cudaStatus, EngineClient, RegionStore, restoreEngine, suspendEngine, VsnapError, type GpuDevice } from '../../src/index.js';
import { DeviceAllocation, listDevices, releaseIdleResources } from '../../src/plumbing.js';
import { nativeCheckpointBackend } from '../../src/flows/deep.js';
import type { Snapshot } from '../../src/snapshot/snapshot.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';

const MODEL_ARGS = ['--layers', '18', '--hidden', '2048'];
const ms = (s: number | undefined): string => (s === undefined ? '-' : `${(s * 1000).toFixed(1)} ms`);

/** The GPU (UUID) and memory (MiB) nvidia-smi lists a process on, or null. */
function smiOf(pid: number): { uuid: string; mib: number } | null {
  const out = execFileSync('nvidia-smi', ['--query-compute-apps=pid,gpu_uuid,used_memory', '--format=csv,noheader,nounits'], { encoding: 'utf8' });
  const row = out.split('\n').map((l) => l.split(',').map((x) => x.trim())).find(([p]) => Number(p) === pid);
  return row ? { uuid: row[1]!, mib: Number(row[2]) } : null;
}

const outcome = (p: Promise<unknown>): Promise<string> =>
  p.then(
    () => 'accepted',
    (e: VsnapError) => `${e.code} ${JSON.stringify({ cudaError: e.details.cudaError, reason: e.details.reason })}`,
  );

describe('GPU: a deep-suspended engine restored onto another GPU', async () => {
  const status = await cudaStatus();
  const gpus: GpuDevice[] = status.available ? await listDevices() : [];
  const why = !status.available
    ? `needs NVIDIA GPUs: ${status.reason}`
    : !status.checkpointApi
      ? `driver ${status.driverVersion} lacks the process checkpoint API`
      : status.driverVersion < 13000
        ? `GPU pairs in the restore arguments need driver r580 (CUDA 13.0); this one supports ${status.driverVersion}`
        : gpus.length < 2
          ? `needs two GPUs, this machine has ${gpus.length}`
          : gpus[0]!.name !== gpus[1]!.name
            ? `needs two GPUs of the same kind: ${gpus[0]!.name} and ${gpus[1]!.name}`
            : '';
  if (why) {
    it('restore onto another GPU', (t) => t.skip(why));
    return;
  }
  const [g0, g1] = [gpus[0]!, gpus[1]!];
  const backend = nativeCheckpointBackend();
  let a: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let dir: string;
  let snap: Snapshot;
  let expected: Awaited<ReturnType<typeof askCapital>>;
  let pid: number;

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-remap-'));
    store = await RegionStore.open(dir);
    a = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS });
    client = new EngineClient({ baseUrl: a.url, token: a.token });
    pid = (await client.wire.vsnapStatus()).ranks[0]!.pid;
    expected = await askCapital(client, 16);
    snap = await captureEngine(store, 'ref', client);
  });

  after(async () => {
    await client?.close();
    await a?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  /** Brings the engine back running on whatever GPU it is, from any state a refusal left. */
  const recover = async (): Promise<void> => {
    await restoreEngine(snap, client).catch(async () => {
      const s = await backend.state(pid);
      if (s === 'checkpointed') await backend.restore(pid);
      if ((await backend.state(pid)) === 'locked') await backend.unlock(pid);
      if ((await client.wire.vsnapStatus()).sleeping) await restoreEngine(snap, client);
    });
    assert.equal(await backend.state(pid), 'running');
    assert.deepEqual(await askCapital(client, 16), expected);
  };

  it('GPU 0 -> GPU 1 -> GPU 0: the process and its weights move, the answer bit-identical, nvidia-smi lists it on the new GPU', async () => {
    assert.equal(smiOf(pid)?.uuid, g0.uuid, 'the engine starts on GPU 0');
    for (const [from, to] of [
      [g0, g1],
      [g1, g0],
    ] as const) {
      const s = await suspendEngine(store, 'ref', client, { deep: true });
      assert.equal(await backend.state(pid), 'checkpointed');
      const deepSeen = smiOf(pid);
      assert.ok(deepSeen === null || deepSeen.mib === 0, `a deep-suspended engine holds nothing on any GPU (${JSON.stringify(deepSeen)})`);
      const r = await restoreEngine(snap, client, { move: { onto: to.ordinal } });
      const seen = smiOf(pid);
      assert.deepEqual(r.gpus, [to.uuid], 'the export reports the new GPU');
      assert.equal(seen?.uuid, to.uuid, `nvidia-smi lists the engine on ${to.uuid}`);
      assert.deepEqual(await askCapital(client, 16), expected, 'token ids and logprobs bit for bit on the new GPU');
      assert.equal((await client.wire.vsnapStatus()).ranks[0]!.device.uuid, to.uuid, 'the status reports the new GPU after the export');
      console.log(
        `REMAP GPU ${from.ordinal} -> ${to.ordinal}: suspend sleep ${ms(s.phases.sleep)} + lock ${ms(s.phases['deep.lock'])} + checkpoint ${ms(s.phases['deep.checkpoint'])}; ` +
          `restore onto GPU ${to.ordinal}: process restore ${ms(r.phases['deep.restore'])}, unlock ${ms(r.phases['deep.unlock'])}, wakeWeights ${ms(r.phases.wakeWeights)}, ` +
          `export ${ms(r.phases.export)}, hydrate ${ms(r.phases.hydrate)} (${(r.bytes / 2 ** 30).toFixed(2)} GiB), expectedResponse ${ms(r.phases.expectedResponse)}, total ${ms(r.seconds)}; ` +
          `engine then ${seen?.mib} MiB on ${seen?.uuid}`,
      );
    }
  });

  it('what the driver refuses: a lone pair, and (printed) identity pairs; the engine is recovered after each', async () => {
    for (const [what, pairs] of [
      ['a lone pair 0->1', [{ oldUuid: g0.uuid, newUuid: g1.uuid }]],
      ['identity pairs 0->0, 1->1', gpus.map((g) => ({ oldUuid: g.uuid, newUuid: g.uuid }))],
    ] as const) {
      await suspendEngine(store, 'ref', client, { deep: true });
      const got = await outcome(backend.restore(pid, pairs));
      const state = await backend.state(pid);
      console.log(`REMAP driver: restore with ${what}: ${got}; the process is then ${state}`);
      if (what.startsWith('a lone')) assert.match(got, /^E_CHECKPOINT /, 'a lone pair on a two-GPU machine is refused');
      await recover();
    }
  });

  /** Fills GPU 1 so that about `leaveBytes` stay free; returns the fill to close and what is free. */
  const fillGpu1 = async (leaveBytes: number): Promise<{ close: () => void; freeMiB: number }> => {
    const probe = await DeviceAllocation.allocate(g1.ordinal, 2 << 20); // this process's context on GPU 1 first
    const free = (await listDevices({ freeMemory: true })).find((d) => d.uuid === g1.uuid)!.freeMemory!;
    const fillBytes = Math.floor((free - leaveBytes) / g1.vmmGranularity) * g1.vmmGranularity;
    const fill = await DeviceAllocation.allocate(g1.ordinal, fillBytes);
    const left = (await listDevices({ freeMemory: true })).find((d) => d.uuid === g1.uuid)!.freeMemory!;
    return {
      close: () => {
        fill.close();
        probe.close();
      },
      freeMiB: left / 2 ** 20,
    };
  };

  it("a target GPU without room for the process, then without room for its weights: the SDK refuses before the driver is called (still 'checkpointed' on GPU 0), and a plain restore then works", async () => {
    assert.equal(smiOf(pid)?.uuid, g0.uuid);
    const weights = snap.manifest.totalBytes;
    // 64 MiB: no room for the process; process estimate (2 GiB) + half the weights: room for the
    // process (about 0.7 GiB measured) but not for the weights the wake allocates right after.
    for (const [what, leave] of [
      ['the process', 64 * 2 ** 20],
      ['its weights', 2 * 2 ** 30 + Math.floor(weights / 2)],
    ] as const) {
      await suspendEngine(store, 'ref', client, { deep: true });
      assert.equal(await backend.state(pid), 'checkpointed');
      const fill = await fillGpu1(leave);
      try {
        const err = await restoreEngine(snap, client, { move: { onto: g1.ordinal } }).then(
          () => undefined,
          (e: VsnapError) => e,
        );
        const state = await backend.state(pid);
        console.log(`REMAP onto a GPU with ${fill.freeMiB.toFixed(0)} MiB free (no room for ${what}): ${err ? `${err.code} ${JSON.stringify(err.details.gpus)}\n  ${err.message}` : 'accepted'}; the process is then ${state}`);
        assert.equal(err?.code, 'E_INVALID_ARGUMENT', 'the SDK refuses the move');
        assert.equal(err?.details.reason, 'memory');
        assert.equal(state, 'checkpointed', 'no driver call was made: the process is still checkpointed');
      } finally {
        fill.close();
      }
      const r = await restoreEngine(snap, client);
      assert.equal(await backend.state(pid), 'running');
      assert.equal(smiOf(pid)?.uuid, g0.uuid, 'a plain restore brings it back on GPU 0');
      assert.deepEqual(await askCapital(client, 16), expected);
      console.log(`REMAP after the refusal, a plain restore: ${ms(r.seconds)}, engine on ${smiOf(pid)?.uuid}`);
    }
  });

  it('an engine that sees one GPU only (CUDA_VISIBLE_DEVICES): what the driver does with the whole permutation and with a lone pair (printed)', async () => {
    const solo = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS, env: { CUDA_VISIBLE_DEVICES: g0.uuid } });
    const soloClient = new EngineClient({ baseUrl: solo.url, token: solo.token });
    try {
      const soloPid = (await soloClient.wire.vsnapStatus()).ranks[0]!.pid;
      const answer = await askCapital(soloClient, 16);
      for (const [what, pairs] of [
        ['the whole permutation 0->1, 1->0', [{ oldUuid: g0.uuid, newUuid: g1.uuid }, { oldUuid: g1.uuid, newUuid: g0.uuid }]],
        ['a lone pair 0->1', [{ oldUuid: g0.uuid, newUuid: g1.uuid }]],
      ] as const) {
        await backend.lock(soloPid, 10_000);
        await backend.checkpoint(soloPid);
        const got = await outcome(backend.restore(soloPid, pairs));
        if ((await backend.state(soloPid)) === 'checkpointed') await backend.restore(soloPid);
        await backend.unlock(soloPid);
        const same = JSON.stringify(await askCapital(soloClient, 16)) === JSON.stringify(answer);
        console.log(`REMAP engine seeing GPU 0 only, restore with ${what}: ${got}; then on ${smiOf(soloPid)?.uuid}, answer ${same ? 'identical' : 'DIFFERENT'}`);
        assert.ok(same, 'the answer survives the checkpoint and restore');
        // back onto GPU 0 for the next probe
        if (smiOf(soloPid)?.uuid === g1.uuid) {
          await backend.lock(soloPid, 10_000);
          await backend.checkpoint(soloPid);
          const back = await outcome(backend.restore(soloPid, [{ oldUuid: g1.uuid, newUuid: g0.uuid }, { oldUuid: g0.uuid, newUuid: g1.uuid }]));
          if ((await backend.state(soloPid)) === 'checkpointed') await backend.restore(soloPid);
          await backend.unlock(soloPid);
          console.log(`REMAP engine seeing one GPU, back with the whole permutation: ${back}; then on ${smiOf(soloPid)?.uuid}`);
        }
      }
    } finally {
      await soloClient.close();
      await solo.stop();
    }
  });

  it('exported descriptors still open: the SDK refuses deep suspend; the raw driver calls are printed', async () => {
    // whatever an earlier test left: the engine running and awake (the export needs its weights)
    if ((await backend.state(pid)) !== 'running' || (await client.wire.vsnapStatus()).sleeping) await recover();
    const { control } = await engineControl(client);
    const open = await exportRegions(control, 1);
    try {
      const err = await suspendEngine(store, 'ref', client, { deep: true }).then(
        () => undefined,
        (e: VsnapError) => e,
      );
      assert.equal(err?.code, 'E_ENGINE_STATE');
      assert.equal(err?.details.reason, 'handles');
      assert.equal(await backend.state(pid), 'running', 'nothing locked');
      // what the driver itself does with the SDK's descriptors open (the engine asleep at level 2)
      const lock = await outcome(backend.lock(pid, 10_000));
      const checkpoint = lock === 'accepted' ? await outcome(backend.checkpoint(pid)) : 'not tried';
      const state = await backend.state(pid);
      const remap = state === 'checkpointed' ? await outcome(backend.restore(pid, [{ oldUuid: g0.uuid, newUuid: g1.uuid }, { oldUuid: g1.uuid, newUuid: g0.uuid }])) : 'not tried';
      console.log(`REMAP driver with ${open.ranks[0]!.regions.length} exported descriptors open: lock ${lock}, checkpoint ${checkpoint}, remapping restore ${remap}; then ${await backend.state(pid)}`);
    } finally {
      open.close();
    }
    await recover();
  });

  // Last: this may leave the engine's process unrestorable (as driver 580 did), so the engine is
  // stopped at the end and nothing runs after it but the teardown.
  it('the raw driver (printed): a restore with pairs onto a full GPU, what state it leaves, and whether a plain restore then works; the engine is stopped after', async () => {
    if ((await backend.state(pid)) !== 'running' || (await client.wire.vsnapStatus()).sleeping) await recover();
    if (smiOf(pid)?.uuid !== g0.uuid) {
      // an earlier test left it on GPU 1 (the open-descriptors one moves it): back to GPU 0 first
      await suspendEngine(store, 'ref', client, { deep: true });
      await restoreEngine(snap, client, { move: { onto: g0.ordinal } });
    }
    assert.equal(smiOf(pid)?.uuid, g0.uuid);
    await suspendEngine(store, 'ref', client, { deep: true });
    const fill = await fillGpu1(64 * 2 ** 20);
    let got: string;
    let state: string;
    try {
      got = await outcome(backend.restore(pid, [{ oldUuid: g0.uuid, newUuid: g1.uuid }, { oldUuid: g1.uuid, newUuid: g0.uuid }]));
      state = await backend.state(pid);
    } finally {
      fill.close();
    }
    const plain = state === 'checkpointed' ? await outcome(backend.restore(pid)) : 'not tried';
    const then = await backend.state(pid).then(
      (x) => x,
      (e: VsnapError) => `unreadable (${e.code})`,
    );
    console.log(`REMAP raw driver: restore with pairs onto GPU 1 with ${fill.freeMiB.toFixed(0)} MiB free: ${got}; the process is then ${state}; memory freed, a plain restore: ${plain}; then ${then}`);
    await a.stop(); // the teardown closes the client
    assert.match(got, /^E_CHECKPOINT /, 'the driver refuses a restore onto a GPU without room');
  });
});
