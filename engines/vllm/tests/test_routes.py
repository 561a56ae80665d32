"""How the /vsnap/v1 routes get onto vLLM's app: the endpoint plugin (init_state's engine
client, None on a render server), a build_app wrap only where the running vLLM defines and
calls build_app in vllm.entrypoints.openai.api_server, and never a silent no-op."""

import asyncio
import json
import os
import subprocess
import sys
import unittest

from tests import support
from tests.test_api import FakeApp, FakeClient, call
from vsnap_vllm import adapter, api
from vsnap_vllm.endpoint import plugin

AUTH = {"authorization": "Bearer s3cret"}


class EndpointPluginTest(unittest.TestCase):
    def setUp(self):
        os.environ["VSNAP_TOKEN"] = "s3cret"
        self.saved = dict(api.MOUNTED)
        self.backoff, adapter.RELEASE_BACKOFF = adapter.RELEASE_BACKOFF, 0

    def tearDown(self):
        adapter.RELEASE_BACKOFF = self.backoff
        os.environ.pop("VSNAP_TOKEN", None)
        api.MOUNTED.clear()
        api.MOUNTED.update(self.saved)

    def test_attaches_and_uses_the_engine_client_from_init_state(self):
        ep = plugin()
        self.assertEqual((ep.name, ep.required_tasks), ("vsnap", None))
        app = FakeApp(FakeClient())  # app.state.engine_client: not what the routes must use
        ep.attach_router(app)
        ours = FakeClient()
        asyncio.run(ep.init_state(ours, app.state, None))
        status, body = call(app, "GET", "/vsnap/v1/status", AUTH)
        self.assertEqual(status, 200)
        self.assertEqual(body["routes"]["mechanism"], "endpoint_plugins")
        self.assertEqual(ours.calls, [("vsnap_status", ())])
        self.assertEqual(app.state.engine_client.calls, [])

    def test_a_render_server_has_no_engine_client_the_routes_say_so(self):
        ep = plugin()
        app = FakeApp(None)
        ep.attach_router(app)
        asyncio.run(ep.init_state(None, app.state, None))
        status, body = call(app, "POST", "/vsnap/v1/sleep", AUTH, {"level": 1})
        self.assertEqual(status, 503)
        self.assertIn("no engine client", body["error"])

    def test_attach_failure_is_reported_not_raised(self):
        class NoRoutes:
            state = type("S", (), {})()

        plugin().attach_router(NoRoutes())  # must not raise into vLLM's build_app
        self.assertIsNone(api.MOUNTED["mechanism"])
        self.assertIn("add_api_route", api.MOUNTED["detail"])

    def release_client(self, failures):
        """A client whose release_kv_cache_memory fails with each error of `failures` in turn."""
        client = FakeClient()
        failures = list(failures)

        async def sleep(level, mode="abort"):
            client.calls.append(("sleep", level, mode))

        async def wake_up(tags):
            client.calls.append(("wake_up", tags))

        async def release_kv_cache_memory():
            client.calls.append(("release",))
            if failures:
                raise failures.pop(0)

        client.sleep, client.wake_up, client.release_kv_cache_memory = sleep, wake_up, release_kv_cache_memory
        app = FakeApp(client)
        api.mount(app)
        return app, client

    def test_release_kv_cache_pauses_waiting_for_running_requests_then_releases(self):
        app, client = self.release_client([])
        self.assertEqual(call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH), (200, {"status": "kv_cache_released", "attempts": 1}))
        self.assertEqual(client.calls, [("sleep", 0, "wait"), ("release",)])
        older = FakeApp(FakeClient())  # an engine client without release_kv_cache_memory
        api.mount(older)
        status, body = call(older, "POST", "/vsnap/v1/release_kv_cache", AUTH)
        self.assertEqual(status, 501)
        self.assertIn("release_kv_cache_memory", body["error"])

    def test_requests_queued_the_engine_is_resumed_and_the_release_tried_again(self):
        # vLLM refuses the release while requests are queued (vllm/v1/engine/core.py): the route
        # resumes the engine (they are admitted), then pauses with mode wait and tries again.
        queued = RuntimeError("release_kv_cache_memory() requires a completed pause first")
        app, client = self.release_client([queued, queued])
        self.assertEqual(call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH, {"queued": "wait"}), (200, {"status": "kv_cache_released", "attempts": 3}))
        resume = ("wake_up", ["scheduling"])
        self.assertEqual(client.calls, [("sleep", 0, "wait"), ("release",), resume, ("sleep", 0, "wait"), ("release",), resume, ("sleep", 0, "wait"), ("release",)])

    def test_abort_policy_aborts_the_queue_and_a_failure_never_leaves_the_engine_paused(self):
        app, client = self.release_client([])
        self.assertEqual(call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH, {"queued": "abort"})[0], 200)
        self.assertEqual(client.calls[0], ("sleep", 0, "abort"))
        queued = RuntimeError("release_kv_cache_memory() requires a completed pause first")
        app, client = self.release_client([queued])
        status, body = call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH, {"queued": "abort"})
        self.assertEqual(status, 409)
        self.assertIn("queued", body["error"])
        self.assertEqual(client.calls[-1], ("wake_up", ["scheduling"]))  # resumed
        app, client = self.release_client([RuntimeError("release_kv_cache_memory() requires all executor memory to be resident")])
        status, body = call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH)
        self.assertEqual(status, 500)
        self.assertEqual(client.calls, [("sleep", 0, "wait"), ("release",), ("wake_up", ["scheduling"])])  # no retry, resumed
        app, client = self.release_client([queued] * 8)
        status, body = call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH)
        self.assertEqual(status, 409)  # still queued at the last attempt
        self.assertEqual(client.calls.count(("wake_up", ["scheduling"])), 8)
        self.assertEqual(call(app, "POST", "/vsnap/v1/release_kv_cache", AUTH, {"queued": "keep"})[0], 400)

    def test_reset_prefix_cache_false_is_an_error(self):
        client = FakeClient()

        async def reset_prefix_cache():
            return False

        client.reset_prefix_cache = reset_prefix_cache
        app = FakeApp(client)
        api.mount(app)
        status, body = call(app, "POST", "/vsnap/v1/reset_prefix_cache", AUTH)
        self.assertEqual(status, 409)

    def test_reload_weights_runs_the_workers_reload_weights(self):
        client = FakeClient()
        app = FakeApp(client)
        api.mount(app)
        self.assertEqual(call(app, "POST", "/vsnap/v1/reload_weights", AUTH), (200, {"status": "reloaded"}))
        self.assertEqual(client.calls, [("reload_weights", ())])
        self.assertEqual(call(app, "POST", "/vsnap/v1/reload_weights", {})[0], 401)  # authenticated like every vsnap route
        self.assertEqual(client.calls, [("reload_weights", ())])

    def test_describe_answers_every_ranks_region_table(self):
        client = FakeClient()
        app = FakeApp(client)
        api.mount(app)
        status, body = call(app, "GET", "/vsnap/v1/describe", AUTH)
        self.assertEqual(status, 200)
        self.assertIn("ranks", body)
        self.assertEqual(client.calls, [("vsnap_describe", ())])
        self.assertEqual(call(app, "GET", "/vsnap/v1/describe", {})[0], 401)

    def test_digest_asks_every_rank_for_its_digests_in_the_chunk_size_given(self):
        client = FakeClient()
        app = FakeApp(client)
        api.mount(app)
        status, body = call(app, "POST", "/vsnap/v1/digest", AUTH, {"chunkSize": 64 << 20})
        self.assertEqual(status, 200)
        self.assertIn("ranks", body)
        self.assertEqual(client.calls, [("vsnap_digest", (64 << 20,))])
        for bad in ({}, {"chunkSize": 0}, {"chunkSize": 24}, {"chunkSize": "4096"}, {"chunkSize": True}, {"chunkSize": 2 << 30}):
            status, body = call(app, "POST", "/vsnap/v1/digest", AUTH, bad)
            self.assertEqual(status, 400, bad)
            self.assertIn("chunkSize", body["error"])
        self.assertEqual(call(app, "POST", "/vsnap/v1/digest", {}, {"chunkSize": 4096})[0], 401)
        self.assertEqual(client.calls, [("vsnap_digest", (64 << 20,))])  # nothing reached the workers

    def test_export_with_a_digest_chunk_size_asks_the_workers_for_both(self):
        client = FakeClient()
        app = FakeApp(client)
        api.mount(app)
        body = {"socket": "/tmp/s", "nonces": ["n0"]}
        self.assertEqual(call(app, "POST", "/vsnap/v1/export", AUTH, body)[0], 200)
        self.assertEqual(call(app, "POST", "/vsnap/v1/export", AUTH, {**body, "digestChunkSize": 4 << 20})[0], 200)
        self.assertEqual(client.calls, [("vsnap_export", ("/tmp/s", ["n0"])), ("vsnap_export", ("/tmp/s", ["n0"], 4 << 20))])
        for bad in (0, 24, "4096", True, 2 << 30):
            status, answer = call(app, "POST", "/vsnap/v1/export", AUTH, {**body, "digestChunkSize": bad})
            self.assertEqual(status, 400, bad)
            self.assertIn("digestChunkSize", answer["error"])
        self.assertEqual(len(client.calls), 2)  # nothing more reached the workers


PROBE = """
import json, os, sys
sys.path[:0] = [%r, %r]
from vsnap_vllm import adapter
ok, how = adapter.patch_api_server(lambda app: None)
print(json.dumps({"ok": ok, "how": how, "endpoint_plugins": adapter.endpoint_plugins_available()}))
""" % (support.FIXTURE, support.PLUGIN)


def probe(**env):
    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class BuildAppDetectionTest(unittest.TestCase):
    def test_newer_vllm_the_shim_is_not_wrapped(self):
        r = probe()
        self.assertTrue(r["endpoint_plugins"])
        self.assertFalse(r["ok"])
        self.assertIn("re-export of vllm.entrypoints.launchers.app.build_app", r["how"])

    def test_older_vllm_build_app_defined_and_called_there_is_wrapped(self):
        r = probe(VSNAP_REF_LEGACY_APP="1")
        self.assertFalse(r["endpoint_plugins"])
        self.assertEqual((r["ok"], r["how"]), (True, "wrapped vllm.entrypoints.openai.api_server.build_app"))

    def test_older_vllm_without_build_app(self):
        r = probe(VSNAP_REF_NO_BUILD_APP="1")
        self.assertEqual((r["ok"], r["how"]), (False, "vllm.entrypoints.openai.api_server has no build_app"))


class CallsGlobalTest(unittest.TestCase):
    def test_a_build_app_defined_but_only_called_through_a_local_name_is_not_wrappable(self):
        import types

        from vsnap_vllm import adapter

        mod = types.ModuleType("fake_api_server")
        exec("def build_app(a):\n    return a\n"
             "_local = build_app\n"
             "def run_server(a):\n    return _local(a)\n", mod.__dict__)
        self.assertFalse(adapter._calls_global(mod, "build_app"))
        exec("def run_server(a):\n    def inner():\n        return build_app(a)\n    return inner()\n", mod.__dict__)
        self.assertTrue(adapter._calls_global(mod, "build_app"))  # nested code counts


if __name__ == "__main__":
    unittest.main()
