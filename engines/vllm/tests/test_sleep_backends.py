"""The reference engine's worker dispatches sleep and wake through a sleep-mode backend made by
SleepModeBackendFactory from model_config.sleep_mode_backend (vLLM main's gpu_worker.py), and
the worker extension class named by --worker-extension-cls is mixed into the worker as vLLM's
init_worker does. Host memory, in-process."""

import types
import unittest

from tests import support
from vllm.device_allocator import cumem
from vllm.device_allocator.sleep_mode_backend import CuMemBackend, SleepModeBackend, SleepModeBackendFactory
from vllm.v1.worker import worker_base
from vllm.v1.worker.gpu_worker import Worker

CALLS = []


class RecordingBackend(SleepModeBackend):
    def suspend(self, level=1):
        CALLS.append(("suspend", level))
        self._state = "SUSPENDED"
        cumem.CuMemAllocator.get_instance().sleep(offload_tags=("weights",))

    def resume(self, tags=None):
        CALLS.append(("resume", tags))
        cumem.CuMemAllocator.get_instance().wake_up(tags)
        self._state = "RUNNING"


def config(**kw):
    base = dict(model="m", revision="r", dtype="bfloat16", seed=3, layers=2, enable_sleep_mode=True,
                keeps_workspace=False, sleep_mode_offload_cudagraph=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def load(**kw):
    worker = Worker(config(**kw))
    worker.load_model()
    worker.initialize_cache()
    return worker


class DispatchTest(unittest.TestCase):
    def setUp(self):
        cumem.CuMemAllocator.instance = None
        CALLS.clear()

    def tearDown(self):
        SleepModeBackendFactory._registry.pop("recording", None)
        support.free_allocator()

    def test_the_default_backend_is_cumem_and_sleeps_as_before(self):
        worker = load()
        answer = worker.generate([1, 2, 3], 4)[0]
        worker.sleep(1)
        self.assertIsInstance(worker._sleep_mode_backend, CuMemBackend)
        self.assertEqual(worker._sleep_mode_backend.state(), "SUSPENDED")
        worker.wake_up(["weights"])
        worker.wake_up(["kv_cache"])
        self.assertEqual(worker.ref_sleep_mode_backend()["state"], "RUNNING")
        self.assertEqual(worker.generate([1, 2, 3], 4)[0], answer)

    def test_a_registered_backend_is_selected_by_name_and_made_once(self):
        SleepModeBackendFactory.register_backend("recording", __name__, "RecordingBackend")
        worker = load(sleep_mode_backend="recording")
        worker.sleep(2)
        worker.wake_up(["weights"])
        worker.wake_up(["kv_cache"])
        self.assertEqual(CALLS, [("suspend", 2), ("resume", ["weights"]), ("resume", ["kv_cache"])])
        self.assertIs(worker._get_sleep_mode_backend(), worker._sleep_mode_backend)

    def test_a_name_registered_twice_or_unknown_is_refused(self):
        SleepModeBackendFactory.register_backend("recording", __name__, "RecordingBackend")
        with self.assertRaisesRegex(ValueError, "already registered"):
            SleepModeBackendFactory.register_backend("recording", __name__, "RecordingBackend")
        worker = load(sleep_mode_backend="nope")
        with self.assertRaisesRegex(ValueError, "Registered backends: .*cumem"):
            worker.sleep(1)

    def test_the_base_backend_refuses_a_discard(self):
        with self.assertRaisesRegex(RuntimeError, "does not support selective discard"):
            RecordingBackend().discard(("kv_cache",))


class Extension:
    def ext_hello(self):
        return f"hello from rank {self.rank}"


class Clashing:
    def sleep(self):
        return None


class WorkerExtensionTest(unittest.TestCase):
    def test_the_extension_joins_the_worker_s_bases_once(self):
        cls = type("W", (Worker,), {})
        worker_base.inject_worker_extension(cls, f"{__name__}.Extension")
        worker_base.inject_worker_extension(cls, f"{__name__}.Extension")
        self.assertEqual(cls.__bases__, (Worker, Extension))
        self.assertEqual(cls(config()).ext_hello(), "hello from rank 0")

    def test_an_attribute_the_worker_has_is_a_conflict(self):
        cls = type("W", (Worker,), {})
        with self.assertRaisesRegex(AssertionError, "conflicts with the worker extension class"):
            worker_base.inject_worker_extension(cls, f"{__name__}.Clashing")


if __name__ == "__main__":
    unittest.main()
