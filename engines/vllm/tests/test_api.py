import asyncio
import json
import os
import unittest

from tests import support  # noqa: F401
from vsnap_vllm import api


class FakeApp:
    def __init__(self, client):
        self.state = type("State", (), {"engine_client": client})()
        self.routes = {}

    def add_api_route(self, path, endpoint, methods):
        for m in methods:
            self.routes[(m, path)] = endpoint


class FakeRequest:
    def __init__(self, app, headers=None, body=b""):
        self.app, self.headers, self._body = app, headers or {}, body

    async def body(self):
        return self._body


class FakeClient:
    def __init__(self):
        self.calls = []
        self.model_config = type("M", (), {"model": "m", "revision": None, "dtype": "torch.bfloat16", "quantization": None})()

    async def sleep(self, level):
        self.calls.append(("sleep", level))

    async def wake_up(self, tags):
        self.calls.append(("wake_up", tags))

    async def is_sleeping(self):
        return False

    async def collective_rpc(self, method, args=()):
        self.calls.append((method, args))
        return [{"rank": 0, "engine": {"kind": "vllm", "attentionBackend": "TRITON_ATTN"}, "model": {"id": "m", "dtype": "bfloat16"}}]

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def call(app, method, path, headers=None, body=None):
    endpoint = app.routes[(method, path)]
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    response = asyncio.run(endpoint(FakeRequest(app, headers, raw)))
    return response.status_code, json.loads(response.body)


class RoutesTest(unittest.TestCase):
    def setUp(self):
        self.client = FakeClient()
        self.app = FakeApp(self.client)
        os.environ["VSNAP_TOKEN"] = "s3cret"
        api.mount(self.app)
        self.auth = {"authorization": "Bearer s3cret"}

    def tearDown(self):
        os.environ.pop("VSNAP_TOKEN", None)

    def test_every_route_needs_the_token(self):
        for (method, path) in self.app.routes:
            status, body = call(self.app, method, path, {"authorization": "Bearer wrong"})
            self.assertEqual(status, 401, path)
            status, _ = call(self.app, method, path, {})
            self.assertEqual(status, 401, path)
        self.assertEqual(self.client.calls, [])

    def test_no_token_configured_disables_the_routes(self):
        os.environ.pop("VSNAP_TOKEN")
        status, body = call(self.app, "POST", "/vsnap/v1/sleep", self.auth, {"level": 2})
        self.assertEqual(status, 503)
        self.assertIn("VSNAP_TOKEN", body["error"])
        self.assertEqual(self.client.calls, [])

    def test_sleep_wake_export_status(self):
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/sleep", self.auth, {"level": 2}), (200, {"status": "sleeping", "level": 2}))
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/wake", self.auth, {"tags": ["weights"]})[0], 200)
        status, body = call(self.app, "POST", "/vsnap/v1/export", self.auth, {"socket": "/tmp/x", "nonces": ["n" * 64]})
        self.assertEqual(status, 200)
        self.assertEqual(self.client.calls[2], ("vsnap_export", ("/tmp/x", ["n" * 64])))
        status, body = call(self.app, "GET", "/vsnap/v1/status", self.auth)
        self.assertEqual(status, 200)
        self.assertEqual(body["engine"]["attentionBackend"], "TRITON_ATTN")
        self.assertEqual(body["model"]["dtype"], "bfloat16")
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/reset_prefix_cache", self.auth)[0], 200)

    def test_bad_bodies_are_400(self):
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/sleep", self.auth, b"{nope")[0], 400)
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/sleep", self.auth, {"level": 7})[0], 400)
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/wake", self.auth, {"tags": "weights"})[0], 400)
        self.assertEqual(call(self.app, "POST", "/vsnap/v1/export", self.auth, {"socket": 3})[0], 400)


if __name__ == "__main__":
    unittest.main()
