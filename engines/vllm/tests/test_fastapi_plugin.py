"""The /vsnap/v1 routes inside vLLM's web stack: a FastAPI app served by uvicorn on loopback,
built as vLLM's build_app builds it (the plugin loaded from its `vllm.endpoint_plugins` entry
point, attach_router after the core routers, init_state from init_app_state), with an engine
client of vLLM's EngineClient signatures; and the older build_app wrap, under FastAPI too. FastAPI
hands the request only to a parameter annotated Request: an unannotated one answered 422."""

import json
import os
import unittest

from tests import web_support as w
from vsnap_vllm import adapter, api

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NONCES = ["n" * 64]
ROUTES = [
    ("GET", "/vsnap/v1/status", None),
    ("GET", "/vsnap/v1/describe", None),
    ("POST", "/vsnap/v1/digest", {"chunkSize": 4096}),
    ("POST", "/vsnap/v1/export", {"socket": "/tmp/vsnap.sock", "nonces": NONCES}),
    ("POST", "/vsnap/v1/sleep", {"level": 2}),
    ("POST", "/vsnap/v1/wake", {"tags": ["weights"]}),
    ("POST", "/vsnap/v1/wake", {"tags": ["weights"], "adopt": {"socket": "/tmp/vsnap.sock", "nonces": NONCES}}),
    ("POST", "/vsnap/v1/reset_prefix_cache", None),
    ("POST", "/vsnap/v1/release_kv_cache", None),
    ("POST", "/vsnap/v1/reload_weights", None),
]


class FastAPIPluginTest(unittest.TestCase):
    legacy = False

    def setUp(self):
        w.require_fastapi(self)
        w.plugin_site()
        self.env = {k: os.environ.get(k) for k in ("VLLM_PLUGINS", "VSNAP_TOKEN")}
        os.environ.update(VLLM_PLUGINS="vsnap", VSNAP_TOKEN=TOKEN)
        self.mounted = dict(api.MOUNTED)
        self.client = w.FakeEngineClient()
        self.port, self.stop = w.serve("fastapi", self.client, legacy=self.legacy)

    def tearDown(self):
        self.stop()
        api.MOUNTED.clear()
        api.MOUNTED.update(self.mounted)
        for k, v in self.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def call(self, method, path, body=None, headers=AUTH):
        status, content_type, raw = w.request(self.port, method, path, body, headers)
        return status, w.as_json(raw)

    def test_every_route_answers(self):
        answers = {path + (" adopt" if body and "adopt" in body else ""): self.call(method, path, body) for method, path, body in ROUTES}
        for route, (status, body) in answers.items():
            self.assertEqual(status, 200, f"{route}: {body}")
        status = answers["/vsnap/v1/status"][1]
        self.assertEqual(status["routes"]["mechanism"], "build_app wrap" if self.legacy else "endpoint_plugins")
        self.assertEqual(status["ranks"][0]["rank"], 0)
        self.assertEqual(answers["/vsnap/v1/export"][1], {"ranks": [{"rank": 0, "regions": 1, "bytes": 4096}]})
        self.assertEqual(answers["/vsnap/v1/describe"][1]["ranks"][0]["regions"][0]["wakeWrites"], False)
        self.assertEqual(answers["/vsnap/v1/digest"][1]["ranks"][0]["regions"][0]["digests"], ["0" * 32])
        self.assertEqual(answers["/vsnap/v1/sleep"][1], {"status": "sleeping", "level": 2})
        self.assertEqual(answers["/vsnap/v1/release_kv_cache"][1], {"status": "kv_cache_released", "attempts": 1})
        calls = [c for c in self.client.calls if c[0] != "collective_rpc" or c[1] != "vsnap_status"]
        self.assertEqual(calls, [
            ("collective_rpc", "vsnap_describe", ()),
            ("collective_rpc", "vsnap_digest", (4096,)),
            ("collective_rpc", "vsnap_export", ("/tmp/vsnap.sock", NONCES)),
            ("sleep", 2, "abort"),
            ("wake_up", ["weights"]),
            ("collective_rpc", "vsnap_adopt", ("/tmp/vsnap.sock", NONCES)),
            ("wake_up", ["weights"]),
            ("reset_prefix_cache", False, False),
            ("sleep", 0, "wait"),
            ("release_kv_cache_memory",),
            ("collective_rpc", "reload_weights", ()),
        ])

    def test_a_missing_or_wrong_token_is_401_and_reaches_no_engine(self):
        for method, path, body in ROUTES:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {TOKEN}"}):
                status, answer = self.call(method, path, body, headers)
                self.assertEqual(status, 401, f"{path} {headers}")
                self.assertEqual(answer, {"error": "missing or wrong bearer token"})
        self.assertEqual(self.client.calls, [])

    def test_bad_bodies_are_400(self):
        for path, body in [("/vsnap/v1/sleep", b"{nope"), ("/vsnap/v1/sleep", {"level": 7}), ("/vsnap/v1/sleep", [1]),
                           ("/vsnap/v1/wake", {"tags": "weights"}), ("/vsnap/v1/wake", {"adopt": {"socket": 1}}),
                           ("/vsnap/v1/export", {"socket": 3}), ("/vsnap/v1/digest", {"chunkSize": 5}), ("/vsnap/v1/release_kv_cache", {"queued": "keep"})]:
            status, answer = self.call("POST", path, body)
            self.assertEqual(status, 400, f"{path} {body}")
            self.assertIn("error", answer)
        self.assertEqual(self.client.calls, [])

    def test_an_engine_call_that_raises_is_a_500_that_says_what(self):
        self.client.fail["wake_up"] = RuntimeError("Worker failed with error 'mapped already'")
        status, answer = self.call("POST", "/vsnap/v1/wake", {"tags": ["weights"]})
        self.assertEqual((status, answer), (500, {"error": "RuntimeError: Worker failed with error 'mapped already'"}))
        self.client.fail["release_kv_cache_memory"] = RuntimeError("release_kv_cache_memory() requires all executor memory to be resident")
        del self.client.fail["wake_up"]
        status, answer = self.call("POST", "/vsnap/v1/release_kv_cache", None)
        self.assertEqual(status, 500)
        self.assertIn("resident", answer["error"])
        self.assertEqual(self.client.calls[-1], ("wake_up", ["scheduling"]))  # not left paused

    def test_vllm_s_own_routes_still_answer(self):
        status, answer = self.call("GET", "/version", None, {})
        self.assertEqual(status, 200)
        self.assertIn("version", answer)


class LegacyBuildAppWrapTest(FastAPIPluginTest):
    """Older vLLM: no endpoint plugins; the general plugin wraps build_app where it is defined and
    called, and the routes read the engine client from app.state."""

    legacy = True


if __name__ == "__main__":
    unittest.main()
