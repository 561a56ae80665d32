// Suspend a running vLLM engine (with the vsnap plugin) and bring it back in well under a second.
//   VSNAP_ENGINE_URL=http://127.0.0.1:8000 VSNAP_TOKEN=... npx tsx examples/suspend-restore.ts [store-dir]
// The engine must run with --enable-sleep-mode, VLLM_PLUGINS=vsnap and the same VSNAP_TOKEN.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { EngineClient, RegionStore, restoreEngine, suspendEngine } from 'vsnap';

const client = new EngineClient({ baseUrl: process.env.VSNAP_ENGINE_URL ?? 'http://127.0.0.1:8000', token: process.env.VSNAP_TOKEN });
const store = await RegionStore.open(process.argv[2] ?? mkdtempSync(join(tmpdir(), 'vsnap-engine-')));
const name = 'my-model';

// Suspend: captures a snapshot first if the store has none that matches this engine, then
// sleeps (level 2: the weights' GPU memory is freed). It refuses rather than lose weights.
const suspended = await suspendEngine(store, name, client, { captureIfNeeded: true });
console.log(`suspended (${suspended.captured ? 'captured first' : 'snapshot already there'}) in ${suspended.seconds.toFixed(2)} s`);

// Restore: wake, export, check the layout, hydrate with verification, wake the KV cache, reset
// the prefix cache, and check the engine still gives the answer it gave at capture.
const report = await restoreEngine(suspended.snapshot, client);
const phases = Object.entries(report.phases)
  .map(([k, v]) => `${k} ${(v * 1000).toFixed(1)} ms`)
  .join(', ');
console.log(`restored ${report.bytes} bytes in ${(report.seconds * 1000).toFixed(1)} ms: ${phases}`);
const answer = await client.completions({ prompt: 'The capital of France is', max_tokens: 8 });
console.log(`the engine answers again: ${JSON.stringify(answer.text)}`);
await client.close();
