"""The reference engine (test/fixtures/engine) where it follows vLLM in ways the bridge could
notice, read from vLLM's source on 2026-12-01 (see the fixture's README for the files): the
allocator collects garbage when it wakes as when it sleeps, a sleep of level 1 or 2 and a KV-cache
release reset the prefix cache first, and Worker.reload_weights takes arguments."""

import types
import unittest
from unittest import mock

from tests import support
from vllm import _reference
from vllm.device_allocator import cumem
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.abstract import Executor
from vllm.v1.worker.gpu_worker import Worker


def config(**kw):
    base = dict(model="m", revision="r", dtype="bfloat16", seed=3, layers=2, enable_sleep_mode=True,
                keeps_workspace=False, sleep_mode_offload_cudagraph=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


class RecordingExecutor(Executor):
    """An executor that records the methods the engine core fans out to its workers."""

    def __init__(self):
        self.calls = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method)
        return [True]


class EngineCoreTest(unittest.TestCase):
    def core(self):
        executor = RecordingExecutor()
        return EngineCore(executor, types.SimpleNamespace()), executor.calls

    def test_a_sleep_of_level_one_or_two_resets_the_prefix_cache_before_the_executor_sleeps(self):
        for level in (1, 2):
            core, calls = self.core()
            core.sleep(level)
            self.assertEqual(calls, ["ref_reset_prefix_cache", "sleep"], f"level {level}")
        core, calls = self.core()
        core.sleep(0)  # a pause: nothing cleared
        self.assertEqual(calls, [])

    def test_a_kv_cache_release_resets_the_prefix_cache_before_the_discard(self):
        core, calls = self.core()
        core.sleep(0)
        core.release_kv_cache_memory()
        self.assertEqual(calls, ["ref_reset_prefix_cache", "discard"])


class WorkerTest(unittest.TestCase):
    def setUp(self):
        cumem.CuMemAllocator.instance = None
        self.saved = _reference.LOAD_SECONDS
        _reference.LOAD_SECONDS = 0

    def tearDown(self):
        _reference.LOAD_SECONDS = self.saved
        support.free_allocator()

    def load(self):
        worker = Worker(config())
        worker.load_model()
        worker.initialize_cache()
        return worker

    def test_the_allocator_collects_garbage_when_it_wakes_as_when_it_sleeps(self):
        worker = self.load()
        with mock.patch.object(cumem.gc, "collect", wraps=cumem.gc.collect) as collect:
            worker.sleep(2)
            self.assertEqual(collect.call_count, 1)
            worker.wake_up(["weights"])
            self.assertEqual(collect.call_count, 2)
            worker.wake_up(["kv_cache"])
            self.assertEqual(collect.call_count, 3)

    def test_reload_weights_takes_the_arguments_vllm_passes_on(self):
        worker = self.load()
        expected = worker.generate([1, 2, 3], 4)[0]
        worker.sleep(2)
        worker.wake_up(["weights"])
        worker.reload_weights("ignored", weights_path=None)
        worker.wake_up(["kv_cache"])
        self.assertEqual(worker.generate([1, 2, 3], 4)[0], expected)


if __name__ == "__main__":
    unittest.main()
