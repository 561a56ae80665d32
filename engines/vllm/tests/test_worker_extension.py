"""The worker methods come from a worker extension class, not attributes set on vLLM's Worker:
the plugin adds VsnapWorkerExtension to the worker's bases as vLLM adds --worker-extension-cls's
(vllm/v1/worker/worker_base.py init_worker), so naming it is the same, and a user's own extension
(an RL framework's) composes with it with no change to either. The reference engine is started
over real HTTP with VLLM_PLUGINS=vsnap and the dev routes' /collective_rpc."""

import os
import shutil
import tempfile
import types
import unittest

from tests import support, web_support
from tests.test_vsnap_sleep_routes import Engine
from vllm.v1.worker import worker_base
from vsnap_vllm import adapter
from vsnap_vllm.worker import VsnapWorkerExtension


class RlExtension:
    """What an RL framework names with --worker-extension-cls (verl, OpenRLHF and the like)."""

    def rl_ping(self):
        return {"rank": self.rank, "vsnap": hasattr(self, "vsnap_status")}


class Combined(VsnapWorkerExtension, RlExtension):
    """A user's mixin of vsnap's extension and their own."""


class InProcessTest(unittest.TestCase):
    def test_the_plugin_adds_the_extension_once(self):
        cls = type("Worker", (worker_base.WorkerBase,), {"load_model": lambda self: None, "rank": 0})
        real = adapter.worker_class
        adapter.worker_class = lambda: cls
        try:
            adapter.add_worker_extension(VsnapWorkerExtension)
            adapter.add_worker_extension(VsnapWorkerExtension)
        finally:
            adapter.worker_class = real
        self.assertEqual(cls.__bases__.count(VsnapWorkerExtension), 1)
        worker_base.inject_worker_extension(cls, "vsnap_vllm.VsnapWorkerExtension")  # named as well: nothing added
        self.assertEqual(cls.__bases__.count(VsnapWorkerExtension), 1)

    def test_the_plugin_adds_it_after_vllm_added_the_user_s_and_leaves_a_mixin_as_it_is(self):
        for named, bases in ((f"{__name__}.RlExtension", (RlExtension, VsnapWorkerExtension)), (f"{__name__}.Combined", (Combined,))):
            cls = type("Worker", (worker_base.WorkerBase,), {"load_model": lambda self: None, "rank": 0})
            worker_base.inject_worker_extension(cls, named)  # vLLM's init_worker, before the worker exists
            real = adapter.worker_class
            adapter.worker_class = lambda: cls
            try:
                adapter.add_worker_extension(VsnapWorkerExtension)  # the plugin, once the model is loaded
            finally:
                adapter.worker_class = real
            self.assertEqual(cls.__bases__[1:], bases)
        self.assertNotIn("vsnap_status", vars(cls))  # no attribute set on the worker class itself

    def test_a_clash_is_refused_before_anything_changes(self):
        cls = type("W", (worker_base.WorkerBase,), {"vsnap_status": lambda self: None})
        real = adapter.worker_class
        adapter.worker_class = lambda: cls
        try:
            with self.assertRaisesRegex(adapter.BridgeUnsupported, "already has vsnap_status"):
                adapter.add_worker_extension(VsnapWorkerExtension)
        finally:
            adapter.worker_class = real
        self.assertEqual(cls.__bases__, (worker_base.WorkerBase,))


class ServedTest(unittest.TestCase):
    def setUp(self):
        web_support.require_fastapi(self)
        self.dir = tempfile.mkdtemp(prefix="vsnap-ram-")
        self.engine = None

    def tearDown(self):
        if self.engine:
            self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_an_rl_framework_s_extension_and_vsnap_s_methods_on_one_worker(self):
        self.engine = Engine(self.dir, extra=("--worker-extension-cls", "tests.test_worker_extension.RlExtension"))
        status, body = self.engine.call("POST", "/collective_rpc", {"method": "rl_ping"})
        self.assertEqual((status, body), (200, {"results": [{"rank": 0, "vsnap": True}]}))
        status, body = self.engine.call("POST", "/collective_rpc", {"method": "vsnap_status"})
        self.assertEqual(status, 200)
        self.assertIn("supported", body["results"][0])

    def test_a_mixin_of_vsnap_s_extension_and_the_user_s(self):
        self.engine = Engine(self.dir, extra=("--worker-extension-cls", "tests.test_worker_extension.Combined"))
        self.assertEqual(self.engine.call("POST", "/collective_rpc", {"method": "rl_ping"}), (200, {"results": [{"rank": 0, "vsnap": True}]}))
        status, body = self.engine.call("POST", "/collective_rpc", {"method": "vsnap_status"})
        self.assertEqual(status, 200, body)
        self.assertTrue(body["results"][0]["supported"], body)

    def test_naming_vsnap_s_class_is_the_same(self):
        self.engine = Engine(self.dir, extra=("--worker-extension-cls", "vsnap_vllm.VsnapWorkerExtension"))
        status, body = self.engine.call("POST", "/collective_rpc", {"method": "vsnap_status"})
        self.assertEqual(status, 200, body)


if __name__ == "__main__":
    unittest.main()
