// Crash test child (GPU suite): suspends an engine keeping its weights in tier 0, says so, waits
// to be killed. argv: <engineUrl> <token> <storeRoot>
import { EngineClient, RegionStore, GpuTier, suspendEngine } from '../../src/index.js';

const [url, token, root] = process.argv.slice(2) as [string, string, string];
const client = new EngineClient({ baseUrl: url, token });
const store = await RegionStore.open(root);
const resident = new GpuTier();
await suspendEngine(store, 'a', client, { captureIfNeeded: true, tiers: { gpu: resident } });
process.stdout.write(`holding ${resident.bytes}\n`);
setInterval(() => undefined, 1000);
