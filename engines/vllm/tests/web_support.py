"""The reference engine's web app built as vLLM builds its own (build_app: the core routers, the
endpoint plugins from their entry point, attach_router, then init_app_state: init_state), around
an engine client with the signatures of vLLM's EngineClient (vllm/engine/protocol.py), served on
loopback by uvicorn (FastAPI) or by the standard-library fallback."""

import asyncio
import http.client
import json
import os
import sys
import tempfile
import types
import unittest

from tests import support  # noqa: F401 - puts the stand-in vllm package and the plugin on sys.path

_SITE = None


def plugin_site():
    """The plugin installed with its entry points (as pip would), on sys.path, once."""
    global _SITE
    if _SITE is None:
        from plugin_site import make_plugin_site

        _SITE = make_plugin_site(tempfile.mkdtemp(prefix="vsnap-web-site-"))
        sys.path.insert(0, _SITE)
    return _SITE


def require_fastapi(test):
    """FastAPI and uvicorn, or the reason they are missing: CI (VSNAP_REQUIRE_FASTAPI=1) fails, a
    machine without them (the GPU machine) skips."""
    from vllm.entrypoints import _web

    if _web.fastapi_available():
        return
    if os.environ.get("VSNAP_REQUIRE_FASTAPI") == "1":
        test.fail("FastAPI and uvicorn are required here (VSNAP_REQUIRE_FASTAPI=1): pip install fastapi uvicorn")
    raise unittest.SkipTest("FastAPI/uvicorn not installed")


class FakeEngineClient:
    """vLLM's EngineClient surface the routes use, recording calls; `fail[name]` makes a call raise."""

    def __init__(self):
        self.calls = []
        self.fail = {}
        self.sleeping = False
        self.model_config = types.SimpleNamespace(model="vsnap/fake", revision="r1", dtype="bfloat16", quantization=None)
        self.vllm_config = types.SimpleNamespace(model_config=self.model_config, parallel_config=types.SimpleNamespace(world_size=1, world_size_across_dp=1))

    async def _record(self, name, *args):
        self.calls.append((name, *args))
        await asyncio.sleep(0)
        if name in self.fail:
            raise self.fail[name]

    async def check_health(self):
        await self._record("check_health")

    async def sleep(self, level=1, mode="abort"):
        await self._record("sleep", level, mode)
        self.sleeping = True

    async def wake_up(self, tags=None):
        await self._record("wake_up", tags)
        self.sleeping = tags is not None and "kv_cache" not in tags
        return not self.sleeping

    async def is_sleeping(self):
        return self.sleeping

    async def release_kv_cache_memory(self):
        await self._record("release_kv_cache_memory")

    async def pause_generation(self, *, mode="abort", wait_for_inflight_requests=False, clear_cache=True):
        if mode not in ("abort", "wait", "keep"):
            raise ValueError(f"Invalid pause mode: {mode}")
        await self._record("pause_generation", mode)

    async def resume_generation(self):
        await self._record("resume_generation")

    async def is_paused(self):
        return False

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        await self._record("collective_rpc", method, tuple(args))
        if method == "vsnap_status":
            return [{"rank": 0, "pid": 1, "engine": {"kind": "vllm", "version": "0.0.0", "pluginVersion": "0.1.0", "attentionBackend": "TRITON_ATTN"},
                     "model": {"id": "vsnap/fake", "revision": "r1", "dtype": "bfloat16", "quantization": None, "tensorParallelSize": 1, "pipelineParallelSize": 1},
                     "device": {"ordinal": 0, "uuid": "host-0"}, "memory": "host", "sleepMode": True, "hooks": "wrapped create_and_map",
                     "weightsMapped": True, "regions": 1, "bytes": 4096, "attentionBackend": "TRITON_ATTN"}]
        if method == "vsnap_describe":
            return [{"version": 1, "rank": 0, "pid": 1, "memory": "host", "device": {"ordinal": 0, "uuid": "host-0"},
                     "regions": [{"key": "w", "tag": "weights", "va": 4096, "size": 4096, "tensors": [], "wakeWrites": False}]}]
        if method == "vsnap_digest":
            return [{"version": 1, "rank": 0, "pid": 1, "memory": "host", "device": {"ordinal": 0, "uuid": "host-0"}, "chunkSize": args[0],
                     "regions": [{"key": "w", "tag": "weights", "va": 4096, "size": 4096, "tensors": [], "wakeWrites": False,
                                  "digests": ["0" * 32]}]}]
        if method == "vsnap_export":
            return [{"rank": 0, "regions": 1, "bytes": 4096}]
        if method == "vsnap_adopt":
            return [{"rank": 0, "regions": 1}]
        return [None]

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        await self._record("reset_prefix_cache", reset_running_requests, reset_connector)
        return True

    async def init_weight_transfer_engine(self, init_request):
        await self._record("init_weight_transfer_engine", init_request.init_info)

    async def start_weight_update(self, is_checkpoint_format=True, include_draft=False):
        await self._record("start_weight_update")

    async def update_weights(self, request):
        await self._record("update_weights", request.update_info)

    async def finish_weight_update(self):
        await self._record("finish_weight_update")

    async def scheduler_stats(self):
        return {"running": 0, "waiting": 0}

    async def generate(self, prompt_ids, max_tokens, prompt_logprobs=False):
        await self._record("generate", len(prompt_ids), max_tokens)
        ids = [(sum(prompt_ids) * 31 + i) % 1000 for i in range(max_tokens)]
        logprobs = [-0.5 - i / 8 for i in range(max_tokens)]
        return (ids, logprobs, [-1.0] * (len(prompt_ids) - 1)) if prompt_logprobs else (ids, logprobs)


def serve(kit_name, client, api_key=None, legacy=False):
    """Builds the app with the `kit_name` web kit (vLLM's way) and serves it: (port, stop)."""
    from vllm.entrypoints import _web

    os.environ["VSNAP_REF_HTTP"] = kit_name
    try:
        args = types.SimpleNamespace(api_key=api_key, host="127.0.0.1", port=0)
        if legacy:
            app = _legacy_app(args)
        else:
            from vllm.entrypoints.launchers.api_server.entry import init_app_state
            from vllm.entrypoints.launchers.app import build_app

            app = build_app(args, ("generate",), client.model_config)
            asyncio.run(init_app_state(client, app.state, args))
        app.state.engine_client = client
    finally:
        os.environ.pop("VSNAP_REF_HTTP", None)
    return _web.start_in_thread(app)


def _legacy_app(args):
    """An older vLLM's app (build_app defined in vllm.entrypoints.openai.api_server, no endpoint
    plugins), with the general plugin's wrap of that build_app in place."""
    from vllm.entrypoints import _web
    from vllm.entrypoints.launchers.app import init_entrypoints_middleware
    from vllm.entrypoints.serve.errors import init_exception_handler
    from vllm.entrypoints.serve.routers import register_api_routers
    from vsnap_vllm import adapter, api

    module = types.ModuleType("vllm.entrypoints.openai.api_server")
    exec("def build_app(args):\n    return _build(args)\n\ndef run_server(args):\n    return build_app(args)\n", module.__dict__)

    def _build(a):
        web = _web.kit()
        app = web.new_app()
        app.state.args = a
        register_api_routers(a, app)
        init_exception_handler(app, web)
        init_entrypoints_middleware(a, app)
        return app

    module._build = _build
    saved = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        ok, how = adapter.patch_api_server(api.mount)
        assert ok, how
        return module.run_server(args)
    finally:
        if saved is None:
            sys.modules.pop(module.__name__, None)
        else:
            sys.modules[module.__name__] = saved


def request(port, method, path, body=None, headers=None):
    """(status, content type, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        raw = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=raw, headers={**({"content-type": "application/json"} if raw else {}), **(headers or {})})
        response = conn.getresponse()
        return response.status, response.getheader("content-type"), response.read()
    finally:
        conn.close()


def as_json(body):
    return json.loads(body) if body else None
