"""`vllm serve ... --enable-sleep-mode --sleep-mode-backend vsnap` with VLLM_PLUGINS=vsnap: the
reference engine (its own processes, the plugin found through its entry point, vLLM's dev routes
over real HTTP) sleeps and wakes through the vsnap backend. Two engines of one model share one
RAM tier: their weights are held once. A level-2 sleep the tier cannot back is answered with the
reason and the engine keeps serving."""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests import support, web_support
from vsnap_vllm.ram_tier import RamTier

SERVE = os.path.join(support.FIXTURE, "serve.py")


class Engine:
    def __init__(self, tier, seed=1, extra=()):
        env = {**os.environ, "VLLM_PLUGINS": "vsnap", "VLLM_SERVER_DEV_MODE": "1", "VSNAP_RAM_TIER": tier,
               "PYTHONPATH": os.pathsep.join((web_support.plugin_site(), support.PLUGIN))}
        self.proc = subprocess.Popen([sys.executable, SERVE, "--device", "host", "--port", "0", "--enable-sleep-mode", "--seed", str(seed),
                                      "--sleep-mode-backend", "vsnap", *extra], env=env, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            self.proc.kill()
            raise RuntimeError(f"the reference engine did not start: {line}")
        self.port = int(line[1])

    def call(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            return r.status, (json.loads(data) if data else None)
        finally:
            conn.close()

    def answer(self):
        status, body = self.call("POST", "/v1/completions", {"model": "vsnap/reference-host", "prompt": "hello there", "max_tokens": 6, "temperature": 0})
        assert status == 200, body
        return body["choices"][0]["text"]

    def backend(self):
        return self.call("POST", "/collective_rpc", {"method": "ref_sleep_mode_backend"})[1]["results"][0]

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


class RoutesTest(unittest.TestCase):
    def setUp(self):
        web_support.require_fastapi(self)
        self.dir = tempfile.mkdtemp(prefix="vsnap-ram-")
        self.tier = RamTier.init(self.dir, 1 << 30)
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, **kw):
        engine = Engine(self.dir, **kw)
        self.engines.append(engine)
        return engine

    def test_level_1_and_2_through_the_routes_wake_by_tags(self):
        a = self.start()
        expected = a.answer()
        self.assertEqual(a.backend()["class"], "vsnap_vllm.sleep_backend.VsnapSleepBackend")
        status, body = a.call("POST", "/sleep?level=2")
        self.assertEqual(status, 500, body)
        self.assertIn("level-2 sleep refused, nothing released", json.dumps(body))
        self.assertEqual(a.call("POST", "/wake_up")[0], 200)  # the pause the refused sleep left is lifted
        self.assertEqual(a.answer(), expected)
        for level in (1, 2):
            self.assertEqual(a.call("POST", f"/sleep?level={level}"), (200, {"status": "sleeping", "level": level}))
            self.assertEqual(a.call("GET", "/is_sleeping")[1], {"is_sleeping": True})
            self.assertEqual(a.call("POST", "/wake_up?tags=weights"), (200, {"status": "sleeping", "tags_woken": ["weights"]}))
            self.assertEqual(a.call("POST", "/wake_up?tags=kv_cache"), (200, {"status": "awake", "tags_woken": ["kv_cache"]}))
            self.assertEqual(a.answer(), expected)
        self.assertEqual(a.call("POST", "/collective_rpc", {"method": "ref_weight_loads"})[1]["results"], ["1"])  # non-dict results str()-ed, as vLLM does

    def test_two_engines_of_one_model_hold_their_weights_once(self):
        a, b = self.start(), self.start()
        expected = a.answer()
        self.assertEqual(a.call("POST", "/sleep?level=1")[0], 200)
        held = self.tier.used_bytes()
        self.assertGreater(held, 0)
        self.assertEqual(b.call("POST", "/sleep?level=1")[0], 200)
        self.assertEqual(self.tier.used_bytes(), held)
        self.assertEqual(len(os.listdir(os.path.join(self.dir, "holds"))), 2)
        for e in (b, a):
            self.assertEqual(e.call("POST", "/wake_up")[0], 200)
            self.assertEqual(e.answer(), expected)
        self.assertEqual(os.listdir(os.path.join(self.dir, "holds")), [])

    def test_tensor_parallel_ranks_each_put_their_shard_in_the_tier(self):
        a = self.start(extra=("--tensor-parallel-size", "2"))
        expected = a.answer()
        self.assertEqual(a.call("POST", "/sleep?level=1")[0], 200)
        self.assertEqual(len(os.listdir(os.path.join(self.dir, "holds"))), 2)  # one a rank
        self.assertEqual(a.call("POST", "/sleep?level=2")[0], 200)  # asleep already: a no-op, as vLLM's executor
        self.assertEqual(a.call("POST", "/wake_up")[0], 200)
        self.assertEqual(a.answer(), expected)

    def test_an_engine_of_another_model_beside_them_is_held_apart(self):
        a, c = self.start(), self.start(seed=2)
        answers = (a.answer(), c.answer())
        self.assertNotEqual(*answers)
        a.call("POST", "/sleep?level=1")
        one = self.tier.used_bytes()
        c.call("POST", "/sleep?level=1")
        self.assertGreater(self.tier.used_bytes(), one)
        for e in (a, c):
            e.call("POST", "/wake_up")
        self.assertEqual((a.answer(), c.answer()), answers)


if __name__ == "__main__":
    unittest.main()
