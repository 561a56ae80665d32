"""Nothing the bridge does may break a model load or a sleep/wake (VLLM-FACTS: a general
plugin's hook that raises inside load_model kills the engine). A failure is injected at each
hook of a real Worker on the reference allocator (host memory): the load, sleep and wake
complete as without the plugin, the answer is unchanged, and the bridge reports why it stepped
aside. Also: the three kinds of weights memory, ROCm handles, and the cudagraph pool."""

import logging
import types
import unittest

from tests import support
import vllm.device_allocator as device_allocator
from vllm import _reference
from vllm.device_allocator import cumem
from vllm.v1.worker.gpu_worker import Worker
from vsnap_vllm import adapter
from vsnap_vllm import bridge as bridge_module
from vsnap_vllm.bridge import Bridge, BridgeError
from vsnap_vllm.drivers import FABRIC, NONE, POSIX_FD


logging.getLogger("vsnap_vllm").setLevel(logging.CRITICAL)  # the injected failures log tracebacks


def unwrap_module_hooks():
    """Undo earlier tests' wrapping of cumem's module-level functions (a process-wide patch)."""
    for name in ("create_and_map", "unmap_and_release"):
        fn = getattr(cumem, name)
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        setattr(cumem, name, fn)


def config(**kw):
    base = dict(model="m", revision="r", dtype="bfloat16", seed=3, layers=2, enable_sleep_mode=True,
                keeps_workspace=False, sleep_mode_offload_cudagraph=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


class Boom(RuntimeError):
    pass


def boom(*_a, **_k):
    raise Boom("injected")


class HookFailureTest(unittest.TestCase):
    handle_types = "none"

    def setUp(self):
        unwrap_module_hooks()
        self.saved = (_reference.HANDLE_TYPES, _reference.ROCM_HANDLES)
        _reference.HANDLE_TYPES = self.handle_types
        cumem.CuMemAllocator.instance = None
        self.bridge = Bridge()
        self.after_load = adapter.guarded("after_load", self.bridge.after_load, self.bridge.fail)

    def tearDown(self):
        unwrap_module_hooks()
        _reference.HANDLE_TYPES, _reference.ROCM_HANDLES = self.saved
        if hasattr(device_allocator, "register_tag_hooks") and device_allocator.register_tag_hooks is device_allocator._register_tag_hooks:
            del device_allocator.register_tag_hooks
        device_allocator._tag_hooks.clear()
        support.free_allocator()

    def load(self, **kw):
        worker = Worker(config(**kw))
        worker.load_model()
        self.after_load(worker)  # what adapter.wrap_load_model runs after vLLM's load_model
        worker.initialize_cache()
        return worker

    def answer(self, worker):
        return worker.generate([1, 2, 3], 4)[0]

    def level_one_round_trip(self, worker):
        expected = self.answer(worker)
        worker.sleep(1)
        worker.wake_up(None)
        self.assertEqual(self.answer(worker), expected)

    def test_status_reads_the_device_uuid_once(self):
        """A deep-suspended worker is locked: any CUDA call blocks, so the status (which the SDK
        reads to find the pids) must make none after the first one."""
        worker = self.load()
        first = self.bridge.status(worker)
        self.bridge.driver.device_uuid = boom
        self.assertEqual(self.bridge.status(worker)["device"], first["device"])

    def test_an_export_reads_the_device_uuid_afresh(self):
        """A process restored onto another GPU (deep suspend with a GPU map) reports that GPU at
        its next export, and its status does from then on."""
        worker = self.load()
        self.bridge.status(worker)
        self.bridge.driver.device_uuid = lambda device: f"MOVED-{device}"
        sent = []
        real = bridge_module.send_fds
        bridge_module.send_fds = lambda path, nonce, header, fds: sent.append(header)
        try:
            self.bridge.export(worker, "/unused", ["a" * 64])
        finally:
            bridge_module.send_fds = real
        self.assertEqual(sent[0]["device"]["uuid"], "MOVED-0")
        self.assertEqual(self.bridge.status(worker)["device"]["uuid"], "MOVED-0")

    # ---- a failure at each hook

    def test_a_failing_after_load_leaves_the_load_and_sleep_intact(self):
        self.bridge._ensure()
        self.bridge.exporter.make_all_exportable = boom
        worker = self.load()
        self.assertIn("after_load: Boom: injected", self.bridge.unsupported)
        self.level_one_round_trip(worker)
        status = self.bridge.status(worker)
        self.assertFalse(status["supported"])
        self.assertIn("Boom", status["unsupportedReason"])
        with self.assertRaises(BridgeError):
            self.bridge.export(worker, "/nonexistent", ["a" * 64])

    def test_a_rehome_failing_midway_leaves_the_load_and_sleep_intact(self):
        self.bridge._ensure()
        real, calls = self.bridge.driver.create_exportable, []

        def second_fails(device, size):
            calls.append(size)
            if len(calls) == 2:
                raise Boom("injected")
            return real(device, size)

        self.bridge.driver.create_exportable = second_fails
        worker = self.load()
        self.assertIn("after_load: Boom: injected", self.bridge.unsupported)
        self.level_one_round_trip(worker)

    def test_a_failing_create_on_wake_falls_back_to_vllms_create(self):
        worker = self.load()
        self.assertIsNone(self.bridge.unsupported)
        self.bridge.exporter.create_on_wake = boom
        self.level_one_round_trip(worker)  # vLLM created the memory and restored its backup
        self.assertIn("create_and_map: Boom", self.bridge.unsupported)
        self.assertFalse(any(d.is_asleep for d in cumem.CuMemAllocator.instance.pointer_to_data.values()))

    def test_a_failing_before_unmap_does_not_stop_the_sleep(self):
        worker = self.load()
        self.bridge.exporter.forget = boom
        expected = self.answer(worker)
        worker.sleep(1)
        self.assertTrue(all(d.is_asleep for d in cumem.CuMemAllocator.instance.pointer_to_data.values()))
        self.assertIn("unmap_and_release: Boom", self.bridge.unsupported)
        worker.wake_up(None)
        self.assertEqual(self.answer(worker), expected)

    def test_a_failing_after_map_with_official_tag_hooks(self):
        device_allocator.register_tag_hooks = device_allocator._register_tag_hooks
        worker = self.load()
        self.assertEqual(self.bridge.hook_mode, "register_tag_hooks")
        self.bridge.exporter.make_all_exportable = boom
        self.level_one_round_trip(worker)
        self.assertIn("after_map: Boom", self.bridge.unsupported)

    def test_the_load_model_wrap_never_lets_after_load_raise_into_load_model(self):
        class FakeWorker:
            def load_model(self):
                self.loaded = True
                return "vllm's result"

        failures = []
        real = adapter.worker_class
        adapter.worker_class = lambda: FakeWorker
        try:
            adapter.wrap_load_model(boom, lambda where, e: failures.append((where, str(e))))
        finally:
            adapter.worker_class = real
        w = FakeWorker()
        self.assertEqual(w.load_model(), "vllm's result")
        self.assertTrue(w.loaded)
        self.assertEqual(failures, [("after_load", "injected")])

    def test_rocm_list_handles_are_refused_cleanly(self):
        _reference.ROCM_HANDLES = True
        worker = self.load()
        self.assertIn("ROCm", self.bridge.unsupported)
        self.level_one_round_trip(worker)
        status = self.bridge.status(worker)
        self.assertFalse(status["supported"])
        self.assertEqual(status["regions"], 0)

    # ---- the kinds of weights memory

    def test_memory_without_export_type_is_rehomed(self):
        worker = self.load()
        report = self.bridge.load_report
        self.assertEqual(report["kinds"], {NONE: report["rehomed"]})
        self.assertGreater(report["rehomed"], 0)
        self.assertEqual(self.bridge.status(worker)["weightsMemory"], {NONE: report["rehomed"]})


class ExportableMemoryTest(HookFailureTest):
    """vLLM since PR #33540 on a GPU without IMEX: POSIX-FD memory, exported as it is."""

    handle_types = "fabric-posix"

    def test_memory_without_export_type_is_rehomed(self):
        pass  # not this kind

    def test_a_rehome_failing_midway_leaves_the_load_and_sleep_intact(self):
        pass  # nothing is rehomed here

    def test_posix_fd_memory_is_exported_as_it_is(self):
        self.bridge._ensure()
        self.bridge.driver.create_exportable = boom  # a rehome would fail: there must be none
        self.bridge.driver.copy = boom
        before = None
        worker = Worker(config())
        worker.load_model()
        before = {a.va: a.handle for a in adapter.allocations("weights")}
        self.after_load(worker)
        self.assertIsNone(self.bridge.unsupported)
        self.assertEqual(self.bridge.load_report["rehomed"], 0)
        self.assertEqual(self.bridge.load_report["kinds"], {POSIX_FD: len(before)})
        self.assertEqual({a.va: a.handle for a in adapter.allocations("weights")}, before)  # same memory, no copy


class FabricOnlyMemoryTest(HookFailureTest):
    """IMEX systems: FABRIC-only memory (simulated on host memory) is rehomed to POSIX-FD memory."""

    handle_types = "fabric"

    def test_memory_without_export_type_is_rehomed(self):
        pass

    def test_fabric_only_memory_is_rehomed(self):
        worker = self.load()
        report = self.bridge.load_report
        self.assertEqual(report["kinds"], {FABRIC: report["rehomed"]})
        for a in adapter.allocations("weights"):
            self.assertTrue(self.bridge.exporter.is_exportable(a))
        self.level_one_round_trip(worker)


class CudagraphPoolTest(HookFailureTest):
    def test_cudagraph_regions_are_not_weights_and_survive_both_levels(self):
        worker = self.load(sleep_mode_offload_cudagraph=True)
        allocator = cumem.CuMemAllocator.instance
        graphs = [(va, d) for va, d in allocator.pointer_to_data.items() if d.tag == "cudagraph"]
        self.assertEqual(len(graphs), 1)
        weights = {a.va for a in adapter.allocations("weights")}
        self.assertNotIn(graphs[0][0], weights)
        status = self.bridge.status(worker)
        self.assertEqual(status["otherTags"], ["cudagraph", "kv_cache"])
        self.assertEqual(status["regions"], len(weights))
        import ctypes

        va, data = graphs[0]
        content = ctypes.string_at(va, data.handle[1])
        worker.sleep(2)  # level 2: the weights are discarded, the graph pool is backed up
        worker.wake_up(None)
        self.assertEqual(ctypes.string_at(va, data.handle[1]), content)


if __name__ == "__main__":
    unittest.main()
