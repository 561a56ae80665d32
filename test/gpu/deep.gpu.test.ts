// GPU suite, deep suspend (device only): the reference engine on CUDA, suspended at level 2 and
// then deep (the driver's process checkpoint API moves the worker's context to host RAM),
// restored bit-identical; the figures of each step; the driver's refusals by pid.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { captureEngine, cudaStatus, EngineClient, RegionStore, restoreEngine, suspendEngine, VsnapError } from '../../src/index.js';
import { releaseIdleResources } from '../../src/plumbing.js';
import { nativeCheckpointBackend } from '../../src/flows/deep.js';
import { askCapital, startEngine, type TestEngine } from '../helpers/engine.js';
import { gpuMemoryOf, gpuUsedMiB } from './nvidia-smi.js';

const MODEL_ARGS = ['--layers', '18', '--hidden', '2048'];
const ms = (s: number | undefined): string => (s === undefined ? '-' : `${(s * 1000).toFixed(1)} ms`);

describe('GPU: deep suspend (process checkpoint) of the reference engine', async () => {
  const status = await cudaStatus();
  if (!status.available || !status.checkpointApi) {
    it('needs a GPU with the process checkpoint API', () => assert.fail(`this suite needs an NVIDIA GPU and driver r570+: ${status.reason || `driver ${status.driverVersion} lacks cuCheckpointProcess*`}`));
    return;
  }
  let a: TestEngine;
  let client: EngineClient;
  let store: RegionStore;
  let dir: string;

  before(async () => {
    dir = mkdtempSync(join(process.env.VSNAP_GPU_STORE_DIR ?? tmpdir(), 'vsnap-gpu-deep-'));
    store = await RegionStore.open(dir);
    a = await startEngine({ device: 'cuda', seed: 1, args: MODEL_ARGS });
    client = new EngineClient({ baseUrl: a.url, token: a.token });
  });

  after(async () => {
    await client?.close();
    await a?.stop();
    rmSync(dir, { recursive: true, force: true });
    await releaseIdleResources();
  });

  it('level 2 then deep: ~0 MiB on the GPU; restore and wake bit-identical; a new restore finds it by pid', async () => {
    const pid = (await client.wire.vsnapStatus()).ranks[0]!.pid;
    assert.equal(pid, a.enginePid);
    const expected = await askCapital(client, 16);
    const snap = await captureEngine(store, 'ref', client);
    const awakeMiB = gpuMemoryOf(pid);

    // level 2 alone, for the comparison
    const plain = await suspendEngine(store, 'ref', client);
    const level2MiB = gpuMemoryOf(pid);
    const level2Used = gpuUsedMiB();
    const plainRestore = await restoreEngine(snap, client);
    assert.deepEqual(await askCapital(client, 16), expected);

    for (let round = 1; round <= 3; round++) {
      const s = await suspendEngine(store, 'ref', client, { deep: true });
      const deepMiB = gpuMemoryOf(pid);
      const deepUsed = gpuUsedMiB();
      assert.equal(await nativeCheckpointBackend().state(pid), 'checkpointed');
      assert.ok(deepMiB === null || deepMiB === 0, `the engine still holds ${deepMiB} MiB after deep suspend`);
      // the plugin's status answers while the worker is checkpointed (no CUDA call in it)
      const st = await client.wire.vsnapStatus();
      assert.equal(st.sleeping, true);
      const r = await restoreEngine(snap, client);
      assert.equal(await nativeCheckpointBackend().state(pid), 'running');
      assert.deepEqual(await askCapital(client, 16), expected, 'token ids and logprobs bit for bit after a deep round trip');
      console.log(
        `DEEP round ${round}: engine GPU memory awake ${awakeMiB} MiB, level 2 ${level2MiB} MiB, deep ${deepMiB ?? 0} MiB ` +
          `(GPU used ${level2Used} -> ${deepUsed} MiB); suspend: sleep ${ms(s.phases.sleep)} (plain level 2: ${ms(plain.phases.sleep)}), ` +
          `+ lock ${ms(s.phases['deep.lock'])}, + checkpoint ${ms(s.phases['deep.checkpoint'])}; restore: + restore ${ms(r.phases['deep.restore'])}, ` +
          `+ unlock ${ms(r.phases['deep.unlock'])}, then wakeWeights ${ms(r.phases.wakeWeights)}, hydrate ${ms(r.phases.hydrate)}, total ${ms(r.seconds)} ` +
          `(plain restore total ${ms(plainRestore.seconds)})`,
      );
    }
  });

  it('the driver refuses a pid that does not exist and a process without a CUDA context: E_CHECKPOINT, named', async () => {
    const backend = nativeCheckpointBackend();
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    const noCuda = child.pid!;
    const dead = spawn('true', [], { stdio: 'ignore' });
    const deadPid = dead.pid!;
    await new Promise((r) => dead.on('exit', r));
    try {
      for (const [what, target] of [['no such process', deadPid], ['no CUDA context', noCuda]] as const) {
        for (const [op, call] of [['lock', () => backend.lock(target, 1000)], ['checkpoint', () => backend.checkpoint(target)], ['state', () => backend.state(target)]] as const) {
          const outcome = await call().then(
            (v) => `resolved ${JSON.stringify(v)}`,
            (e: VsnapError) => `${e.code} ${JSON.stringify(e.details)}`,
          );
          console.log(`DEEP refusal: ${op} of ${what} (pid ${target}): ${outcome}`);
          if (op !== 'state') assert.match(outcome, /^E_CHECKPOINT /, `${op} of ${what} must fail with E_CHECKPOINT`);
          if (op !== 'state' && what === 'no such process') assert.match(outcome, /"reason":"gone"/);
        }
      }
    } finally {
      child.kill('SIGKILL');
    }
  });
});
