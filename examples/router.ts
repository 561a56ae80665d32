// An OpenAI-compatible router that time-shares one GPU between two models: requests go to the
// engine of their `model`, which is woken (and the other suspended) when it does not fit.
//   VSNAP_TOKEN=... npx tsx examples/router.ts http://127.0.0.1:8001=llama http://127.0.0.1:8002=qwen
// Then: curl localhost:8080/v1/completions -H 'content-type: application/json' -d '{"model":"qwen","prompt":"Hello","max_tokens":8}'
import { EngineClient, RamTier, RegionStore, SwapController, type SwapEvent } from 'vsnap';
import { SwapAgent } from 'vsnap/serve';

const GiB = 2 ** 30;
const engines = process.argv.slice(2).map((arg) => {
  const [url, name] = arg.split('=');
  if (!url || !name) throw new Error(`expected <url>=<model>, got ${arg}`);
  return { name, client: new EngineClient({ baseUrl: url, token: process.env.VSNAP_TOKEN }) };
});
if (engines.length < 2) throw new Error('give two or more engines: <url>=<model> ...');

const store = await RegionStore.open(process.env.VSNAP_STORE ?? '/tmp/vsnap-router-store');
// Optional: a pinned RAM tier, so swaps restore at PCIe speed instead of from disk.
const ram = process.env.VSNAP_RAM_GIB ? await RamTier.create({ budgetBytes: Number(process.env.VSNAP_RAM_GIB) * GiB }) : undefined;

const controller = await SwapController.create({
  store,
  ...(ram ? { tiers: { ram } } : {}),
  // Each engine holds ~20 GiB awake; the GPU budget leaves room for one at a time.
  engines: engines.map((e) => ({ ...e, memoryBytes: 20 * GiB, asleepBytes: 2 * GiB })),
  budgets: { 0: Number(process.env.VSNAP_BUDGET_GIB ?? 30) * GiB },
  queue: { limit: 256 },
});
controller.on('swap', (e: SwapEvent) => console.log(`${e.action} ${e.engine}: ${(e.seconds * 1000).toFixed(0)} ms`));

const agent = await SwapAgent.listen({
  controller,
  store,
  port: Number(process.env.PORT ?? 8080),
  ...(process.env.VSNAP_CONTROL_TOKEN ? { controlToken: process.env.VSNAP_CONTROL_TOKEN } : {}),
});
console.log(`routing ${engines.map((e) => e.name).join(', ')} on ${agent.url}`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await agent.close();
    await controller.close();
    ram?.close();
    for (const e of engines) await e.client.close();
    process.exit(0);
  });
}
