"""VSNAP_PROFILE (profile.py): nothing is wrapped or written when it is unset; when set, a real
Worker's level-2 sleep and wake on the reference allocator (host memory) write one line per step,
one per allocation for create_and_map / unmap_and_release with the bridge's hook inside it, and
the allocator's gc.collect; every hook-failure test passes with it on. The allocator module is
put back afterwards (a process-wide patch)."""

import json
import os
import tempfile
import unittest

from tests import support  # noqa: F401
from tests import test_hooks
from tests.test_hooks import config
from vllm import _profile as ref_profile
from vllm.device_allocator import cumem
from vllm.v1.worker.gpu_worker import Worker
from vsnap_vllm import adapter, profile


def unprofile(module):
    for name in ("create_and_map", "unmap_and_release"):
        fn = getattr(module, name)
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        setattr(module, name, fn)
    for name in ("sleep", "wake_up", "discard"):
        fn = getattr(module.CuMemAllocator, name)
        setattr(module.CuMemAllocator, name, getattr(fn, "__wrapped__", fn))
    for name in ("gc", "torch"):
        proxy = getattr(module, name, None)
        if isinstance(proxy, profile._Proxy):
            setattr(module, name, proxy._vsnap_target)
    module.__dict__.pop("_vsnap_profiled", None)


class OffTest(unittest.TestCase):
    def test_unset_costs_nothing(self):
        self.assertIsNone(profile.DIR)  # the test run does not set VSNAP_PROFILE
        self.assertIs(profile.span("x"), profile.NULL)
        self.assertIs(ref_profile.span("x"), profile.NULL)  # the reference engine writes through the plugin's profiler
        fn = lambda: 1  # noqa: E731
        self.assertIs(profile.timed("x", fn), fn)
        self.assertFalse(profile.instrument_allocator(cumem))
        self.assertFalse(hasattr(cumem.create_and_map, "_vsnap_profiled"))


class OnTest(test_hooks.HookFailureTest):
    """Also re-runs every hook-failure test with profiling on: a profiled engine fails the same way."""

    handle_types = "none"  # weights rehomed at load: the wrapped create_and_map path, as with vLLM's real allocator

    def setUp(self):
        super().setUp()
        self.dir = tempfile.TemporaryDirectory()
        for m in (profile, ref_profile):
            m.DIR, m._fd = self.dir.name, None

    def tearDown(self):
        for m in (profile, ref_profile):
            if m._fd is not None:
                os.close(m._fd)
            m.DIR, m._fd, m.RANK = None, None, None
        unprofile(cumem)
        super().tearDown()
        self.dir.cleanup()

    def records(self):
        with open(os.path.join(self.dir.name, f"{os.getpid()}.jsonl")) as f:
            return [json.loads(line) for line in f]

    def test_sleep_and_wake_are_timed_per_allocation(self):
        worker = Worker(config())
        worker.load_model()
        self.after_load(worker)
        worker.initialize_cache()
        self.assertTrue(cumem._vsnap_profiled)
        weights = len(adapter.allocations("weights"))
        everything = len(adapter.allocations())
        worker.sleep(2)
        worker.wake_up(["weights"])
        worker.wake_up(["kv_cache"])
        self.assertEqual(self.answer(worker), self.answer(worker))
        rs = self.records()
        steps = [r["step"] for r in rs]
        self.assertEqual(steps.count("alloc unmap_and_release"), everything)
        self.assertEqual(steps.count("alloc create_and_map"), everything)
        self.assertEqual(steps.count("vsnap.hook before_unmap"), weights)
        self.assertEqual(steps.count("vsnap.hook on_create"), weights)
        self.assertIn("alloc gc.collect", steps)
        for name in ("worker sleep level=2", "worker wake_up weights", "worker wake_up kv_cache", "alloc CuMemAllocator.sleep",
                     "alloc CuMemAllocator.wake_up", "worker generate"):
            self.assertIn(name, steps)
        for r in rs:
            self.assertEqual(set(r) >= {"pid", "rank", "step", "start", "end", "wall"}, True)
            self.assertLessEqual(r["start"], r["end"])
            self.assertEqual(r["rank"], 0)

        def inside(inner, outer):
            return any(o["step"] == outer and o["start"] <= inner["start"] and inner["end"] <= o["end"] for o in rs)

        for r in rs:
            if r["step"] == "vsnap.hook on_create":
                self.assertTrue(inside(r, "alloc create_and_map"), "the bridge's hook runs inside the timed create_and_map")
            if r["step"] == "alloc CuMemAllocator.sleep":
                self.assertTrue(inside(r, "worker sleep level=2"))

    def test_instrumenting_twice_wraps_once(self):
        self.assertTrue(profile.instrument_allocator(cumem))
        first = cumem.create_and_map
        self.assertFalse(profile.instrument_allocator(cumem))
        self.assertIs(cumem.create_and_map, first)


if __name__ == "__main__":
    unittest.main()
