"""The reference engine's two web stacks answer alike, route by route: FastAPI on uvicorn (as
vLLM serves) and the standard-library fallback (for the GPU machine, whose python3.12 has no
FastAPI), built the same way around the same engine client, the vsnap plugin attached from its
entry point. Status, content type and body are compared (ids and timestamps aside), errors
included; so are the streams' events."""

import json
import os
import re
import unittest

from tests import web_support as w

TOKEN = {"authorization": "Bearer s3cret"}
KEY = {"authorization": "Bearer k"}  # the --api-key, for /v1

# (method, path, body, headers): the whole route table, good and bad requests
REQUESTS = [
    ("GET", "/health", None, None),
    ("GET", "/version", None, None),
    ("GET", "/metrics", None, None),
    ("GET", "/v1/models", None, KEY),
    ("GET", "/v1/models", None, None),
    ("GET", "/v1/models", None, {"authorization": "Bearer wrong"}),
    ("POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3, "logprobs": 1}, KEY),
    ("POST", "/v1/completions", {"prompt": "abc", "max_tokens": 2, "echo": True, "logprobs": 1, "return_token_ids": True}, KEY),
    ("POST", "/v1/completions", {"prompt": "abc", "max_tokens": 3, "stream": True}, KEY),
    ("POST", "/v1/completions", {"prompt": 7}, KEY),
    ("POST", "/v1/completions", b"{nope", KEY),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, KEY),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}, KEY),
    ("POST", "/v1/chat/completions", {"messages": "hi"}, KEY),
    ("GET", "/no/such/route", None, None),
    ("GET", "/sleep", None, None),
    ("POST", "/sleep", None, None),
    ("POST", "/sleep?level=2&mode=keep", None, None),
    ("POST", "/sleep?level=7", None, None),
    ("POST", "/sleep?level=-1", None, None),
    ("POST", "/sleep?level=x", None, None),
    ("POST", "/sleep?mode=zz", None, None),
    ("POST", "/release_kv_cache_memory", None, None),
    ("POST", "/wake_up?tags=weights", None, None),
    ("POST", "/wake_up?tags=weights&tags=kv_cache", None, None),
    ("POST", "/wake_up", None, None),
    ("GET", "/is_sleeping", None, None),
    ("POST", "/collective_rpc", b"{nope", None),
    ("POST", "/collective_rpc", {"args": []}, None),
    ("POST", "/collective_rpc", {"method": "reload_weights"}, None),
    ("POST", "/reset_prefix_cache", None, None),
    ("POST", "/reset_prefix_cache?reset_running_requests=true&reset_external=1", None, None),
    ("POST", "/reset_prefix_cache?reset_running_requests=maybe", None, None),
    ("POST", "/pause?mode=keep", None, None),
    ("POST", "/pause?mode=bogus", None, None),
    ("POST", "/resume", None, None),
    ("GET", "/is_paused", None, None),
    ("POST", "/init_weight_transfer_engine", {}, None),
    ("POST", "/init_weight_transfer_engine", {"init_info": {"backend": "reference"}}, None),
    ("POST", "/start_weight_update", None, None),
    ("POST", "/update_weights", {"update_info": {"seed": 2}}, None),
    ("POST", "/update_weights", b"{nope", None),
    ("POST", "/finish_weight_update", None, None),
    ("GET", "/get_world_size", None, None),
    ("GET", "/get_world_size?include_dp=false", None, None),
    ("GET", "/vsnap/v1/status", None, TOKEN),
    ("GET", "/vsnap/v1/status", None, None),
    ("POST", "/vsnap/v1/sleep", {"level": 2}, TOKEN),
    ("POST", "/vsnap/v1/sleep", {"level": 9}, TOKEN),
    ("POST", "/vsnap/v1/wake", {"tags": ["weights"]}, TOKEN),
    ("POST", "/vsnap/v1/export", {"socket": 3}, TOKEN),
    ("POST", "/vsnap/v1/reset_prefix_cache", None, TOKEN),
]

VOLATILE = re.compile(r'"(id|created)":("[^"]*"|\d+)')


def normalise(content_type, body):
    text = VOLATILE.sub(r'"\1":"*"', body.decode())
    if content_type and content_type.startswith("text/event-stream"):
        return [line for line in text.split("\n") if line]
    return text


class BothWebStacksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        w.plugin_site()
        cls.env = {k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "VLLM_PLUGINS", "VSNAP_TOKEN")}
        os.environ.update(VLLM_SERVER_DEV_MODE="1", VLLM_PLUGINS="vsnap", VSNAP_TOKEN="s3cret")

    @classmethod
    def tearDownClass(cls):
        for k, v in cls.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_every_route_answers_alike(self):
        w.require_fastapi(self)
        answers = {}
        for kit_name in ("fastapi", "stdlib"):
            client = w.FakeEngineClient()
            client.fail["release_kv_cache_memory"] = RuntimeError("release_kv_cache_memory() requires a completed pause first")
            port, stop = w.serve(kit_name, client, api_key="k")
            try:
                answers[kit_name] = [w.request(port, m, p, b, h) for m, p, b, h in REQUESTS]
            finally:
                stop()
            answers[kit_name + " calls"] = client.calls
        for (method, path, _, _), fast, std in zip(REQUESTS, answers["fastapi"], answers["stdlib"]):
            with self.subTest(route=f"{method} {path}"):
                self.assertEqual(fast[0], std[0])
                self.assertEqual(fast[1], std[1])
                self.assertEqual(normalise(fast[1], fast[2]), normalise(std[1], std[2]))
        self.assertEqual(answers["fastapi calls"], answers["stdlib calls"])  # the same engine calls, in order

    def test_vllm_answers(self):
        """A few answers spelled out (vLLM's, see test/fixtures/engine/README.md for the files)."""
        w.require_fastapi(self)
        client = w.FakeEngineClient()
        port, stop = w.serve("fastapi", client)
        try:
            status, _, body = w.request(port, "POST", "/sleep?level=2")
            self.assertEqual((status, json.loads(body)), (200, {"status": "sleeping", "level": 2}))
            status, _, body = w.request(port, "POST", "/wake_up?tags=weights")
            self.assertEqual((status, json.loads(body)), (200, {"status": "sleeping", "tags_woken": ["weights"]}))
            status, _, body = w.request(port, "POST", "/wake_up?tags=kv_cache")
            self.assertEqual(json.loads(body), {"status": "awake", "tags_woken": ["kv_cache"]})
            self.assertEqual(w.request(port, "POST", "/release_kv_cache_memory")[2], b'{"status":"kv_cache_released"}')
            self.assertEqual(w.request(port, "POST", "/reset_prefix_cache?reset_external=true")[0:3:2], (200, b""))
            self.assertIn(("reset_prefix_cache", False, True), client.calls)
            self.assertEqual(json.loads(w.request(port, "POST", "/collective_rpc", {"method": "x"})[2]), {"results": [None]})
            status, _, body = w.request(port, "POST", "/sleep?level=3")
            self.assertEqual(status, 400)
            self.assertEqual(json.loads(body)["error"]["param"], "query.level")
            self.assertEqual(json.loads(body)["error"]["code"], 400)
        finally:
            stop()


if __name__ == "__main__":
    unittest.main()
