// What each key of `vsnap serve`'s configuration means: the descriptions of the JSON Schema
// (schema/serve-config.schema.json) and the configuration reference (docs/configuration.md) both come
// from this one table; test/unit/config-schema.test.ts fails when a key of the zod schema has no entry.
export const CONFIG_KEYS: Record<string, string> = {
  listen: 'Where the agent (the OpenAI-compatible API, the control routes and the status page) listens.',
  'listen.host': 'Address to bind. Default 127.0.0.1 (this machine only).',
  'listen.port': 'TCP port. Default 8080; 0 picks a free one (printed at start).',
  'listen.allowedHosts':
    'Host names clients may reach the agent by (the `Host` header), besides IP literals, `localhost` and `*.localhost`, `listen.host` itself and, when it is 0.0.0.0 or ::, this machine\'s host name. `.example.com` accepts its subdomains; `*` accepts any name. Other names get 403 E_HOST_NOT_ALLOWED: a web page that rebinds its own DNS name to this machine cannot drive the agent. Names only: an entry with a port (`example.com:8080`) is refused at load, since any port matches. See docs/serve-security.md.',
  'listen.bodyStallSeconds':
    'A request body that sends nothing for this long gets 408 and gives back the bytes it holds; a body whose bytes wait this long for room in the agent\'s body budget (256 MiB across requests) gets 429. Default 10.',
  'listen.responseStallSeconds':
    'An answer with bytes waiting to be sent that sends none of them for this long (a client that stopped reading) is closed, and its engine is let go (other models can swap in). Default 30.',
  store: 'The snapshot store directory (made if missing). `${env:HOME}` and other `${env:NAME}` work here.',
  controlToken:
    'Bearer token of the control routes (`/engines/:name/...`), the status page data and `vsnap swap` ($VSNAP_CONTROL_TOKEN). Without one the control routes are off. Printable ASCII without spaces (refused at load otherwise).',
  apiKey: 'Bearer token clients must send on the /v1 routes. Without one they are open: set one whenever the agent listens beyond loopback (docs/serve-security.md); serve warns when it listens on 0.0.0.0 or :: without one. Printable ASCII without spaces (refused at load otherwise).',
  publicStatus:
    'Whether /healthz names the engines and /metrics answers without the control token. Default: true without a control token, false with one.',
  ramTierGiB: 'Pinned host memory for the RAM tier, GiB: restores from it are bulk copies, and captures land in it too. Default 0 (none).',
  codec:
    'How snapshots are held wherever serve writes them: `vsnap-c1` codes every chunk that shrinks (BF16 weights to about 0.70 of their size; docs/compression.md) in the RAM tier and in the store blobs of the captures serve makes (at boot, a suspend that captures first, the snapshot route, the capture after a recovery); `off` (default) keeps the raw bytes. A coded store blob loads into the coded RAM tier as it is stored (no second encode).',
  neighbourTier: "The neighbour-GPU tier: suspended models' weights parked in another GPU's free memory (peer copy before the sleep, verified by GPU digest) and restored from there by peer copy (NVLink, ~7x PCIe), between tier 0 and the RAM tier. For models on one GPU other than this one.",
  'neighbourTier.gpu': "The GPU whose free memory holds parked weights (an ordinal). Parked bytes count against its budget under gpus:, and a model waking there evicts them first.",
  'neighbourTier.budgetGiB': 'GiB the tier may hold; its least recently used copies are evicted to park a new one.',
  multipath:
    "Restores from the RAM tier over two PCIe links: part of the bytes go host -> this GPU -> NVLink peer copy while the rest take the model's own GPU's link (1.91x one link measured on two H200s). Needs ramTierGiB; for models on one GPU other than this one.",
  'multipath.gpu': 'The neighbour GPU (an ordinal). It needs room only for a 256 MiB copy ring while a restore runs; without it, the restore takes the direct link alone.',
  gpus: 'GPU memory budgets, by device ordinal ("0", "1", ...): the engines awake on a device never add up to more.',
  'gpus.*.budgetGiB': 'GiB of that GPU the engines may use.',
  defaultModel: 'A model woken whenever nothing else is awake or asked for.',
  queue: 'Requests waiting for an engine to wake.',
  'queue.limit': 'Requests that may wait for one engine. Default 64; beyond that, 503 E_BUSY.',
  'queue.timeoutSeconds': 'How long a request may wait for its engine. Default 120; then 504 E_TIMEOUT.',
  startup: 'How engines that vsnap starts are brought up and stopped.',
  'startup.healthTimeoutSeconds': 'How long an engine may take to answer its health route. Default 900 (loading is slow).',
  'startup.graceSeconds': 'After SIGTERM, how long before SIGKILL. Default 20.',
  recovery:
    "When an engine's snapshot cannot be used (missing, damaged, incompatible, RAM copy lost): what the controller does. See the README's Recovery section.",
  'recovery.mode':
    "`reload` (default): the engine loads its weights again from its own checkpoint (vLLM's reload_weights), checked against the snapshot's expected response where there is one, so the model stays servable; `fail`: the model is refused (E_NOT_RESTORABLE) until its snapshot is captured again.",
  'recovery.materialize':
    'After a recovery, capture a new snapshot: `async` (default: in the background while the engine serves), `required` (before the engine is reported ready) or `off`.',
  models: 'The models served, by name (the OpenAI `model` field): each an engine that is running (url) or that vsnap starts (command).',
  'models.*.url': 'The base URL of an engine that is already running.',
  'models.*.command': 'Or the program that starts the engine; vsnap supervises it (its own process group, restarts with backoff).',
  'models.*.args': 'The command\'s arguments; `${PORT}` is replaced by `port`.',
  'models.*.env': 'Environment variables added for the started engine.',
  'models.*.port': 'The port a started engine listens on (needed with command).',
  'models.*.healthPath': 'The engine\'s health route, polled until it answers 200. Default /health.',
  'models.*.token': 'The engine\'s VSNAP_TOKEN (the vsnap plugin\'s token); also given to a started engine.',
  'models.*.apiKey': 'The engine\'s own --api-key, sent on the /v1 requests vsnap forwards.',
  'models.*.snapshot': 'The name of its snapshot in the store. Default: derived from the model name (`meta-llama/Llama-3.1-8B` becomes `meta-llama--Llama-3.1-8B`).',
  'models.*.registry':
    'An OCI registry reference (`registry.example.com/team/llama-8b:v1`, pushed with `vsnap push`) its snapshot is pulled from, under `snapshot`, when the store lacks it: at start-up (checked against the engine before any layer moves), else by its first restore (with `recovery.mode: reload`); then local. TLS CA from `$VSNAP_REGISTRY_CA`, credentials from `$VSNAP_REGISTRY_USERNAME` and `$VSNAP_REGISTRY_PASSWORD`, else the Docker config file. A pull that fails is logged; the model is then recovered or captured as when its snapshot is missing.',
  'models.*.gpus': 'The GPUs it uses (device ordinals). Default [0].',
  'models.*.memoryGiB': 'GPU memory it holds on each of its GPUs while awake (weights, KV cache, graphs, context).',
  'models.*.asleepGiB': 'GPU memory it still holds on each GPU while suspended. Default 0.',
  'models.*.pinned': 'Never suspended to make room; woken at start. Default false.',
  'models.*.deepSuspend': 'Suspend deep: after the level-2 sleep the driver checkpoints the engine processes (driver r570+), so it holds 0 bytes of GPU memory while asleep. Default false.',
  'models.*.check':
    'The expected-response check its captures record and every restore re-runs, bit for bit. Default: the prompt scored with its log-probabilities plus one generated token (one forward pass).',
  'models.*.check.mode':
    "`prefill` (default): the prompt's log-probabilities (OpenAI `echo` with `logprobs`) and `maxTokens` greedy tokens; `decode`: `maxTokens` greedy tokens only.",
  'models.*.check.maxTokens': 'Tokens generated: default 1 with prefill, 16 with decode. 2 with prefill adds one decode step (vLLM runs decode-only kernels and CUDA graphs there).',
  'models.*.check.prompt': 'The prompt. Default "The capital of France is".',
  'models.*.ttlSeconds': 'Suspended after this long without requests.',
  'models.*.group': 'At most one engine of a group is awake at a time.',
};
