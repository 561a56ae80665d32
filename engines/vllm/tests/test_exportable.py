"""The rehome and wake paths on an allocator shaped like vLLM's (the reference engine's
stand-in, host memory): memory made without a descriptor becomes exportable in place, bytes and
addresses kept; memory created on wake is exportable; vLLM's own release frees what we made."""

import ctypes
import os
import unittest

from tests import support  # noqa: F401
from vllm.device_allocator import cumem
from vsnap_vllm import adapter
from vsnap_vllm.drivers import HostDriver, NotExportable
from vsnap_vllm.exportable import Exporter


def open_fds():
    return len(os.listdir("/proc/self/fd"))


class ExportableTest(unittest.TestCase):
    def setUp(self):
        cumem.CuMemAllocator.instance = None
        self.allocator = cumem.CuMemAllocator.get_instance()
        self.driver = HostDriver()
        self.exporter = Exporter(self.driver)
        self.vas = []
        self.fill = {}  # va -> the byte its memory is filled with
        with self.allocator.use_memory_pool(tag="weights"):
            for i, size in enumerate((65536, 3 * 65536)):
                va = self.allocator.host_malloc(size)
                ctypes.memmove(va, bytes([i + 1]) * size, size)
                self.vas.append(va)
                self.fill[va] = i + 1
        with self.allocator.use_memory_pool(tag="kv_cache"):
            self.kv = self.allocator.host_malloc(65536)

    def tearDown(self):
        for va in self.vas + [self.kv]:
            if va in self.allocator.pointer_to_data:
                data = self.allocator.pointer_to_data[va]
                if data.is_asleep:
                    cumem.create_and_map(data.handle)
                    data.is_asleep = False
                self.allocator.host_free(va)
        cumem.CuMemAllocator.instance = None

    def test_allocations_read_vllms_table(self):
        weights = adapter.allocations("weights")
        self.assertEqual([a.va for a in weights], sorted(self.vas))
        self.assertEqual(sorted(a.size for a in weights), [65536, 3 * 65536])
        self.assertTrue(all(a.handle == 0 for a in weights))  # made without a descriptor
        with self.assertRaises(NotExportable):
            self.driver.export_fd(0, weights[0].handle)

    def test_rehome_makes_memory_exportable_in_place(self):
        weights = adapter.allocations("weights")
        report = self.exporter.make_all_exportable(weights, copy=True)
        self.assertEqual(report["rehomed"], 2)
        for a in weights:
            byte = self.fill[a.va]
            self.assertNotEqual(a.handle, 0)
            self.assertEqual(ctypes.string_at(a.va, 16), bytes([byte]) * 16)  # same address, same bytes
            fd = self.driver.export_fd(0, a.handle)
            self.assertEqual(os.pread(fd, 4, 0), bytes([byte]) * 4)  # the descriptor is this memory
            os.close(fd)
        again = self.exporter.make_all_exportable(adapter.allocations("weights"))
        self.assertEqual((again["rehomed"], again["alreadyExportable"]), (0, 2))

    def test_vllms_release_frees_the_replacement(self):
        self.exporter.make_all_exportable(adapter.allocations("weights"))
        before = open_fds()
        self.allocator.sleep(offload_tags=())  # vLLM's path: module-level unmap_and_release
        self.assertEqual(open_fds(), before - 2)

    def test_wake_creates_exportable_memory_through_the_wrapped_create_and_map(self):
        woken = []
        mode = adapter.install_hooks("weights", lambda a: (self.exporter.create_on_wake(a), woken.append(a.va)), lambda: None, lambda: None, self.fail_hook)
        self.assertEqual(mode, "wrapped create_and_map")
        self.exporter.make_all_exportable(adapter.allocations("weights"))
        self.allocator.sleep(offload_tags=())
        self.allocator.wake_up(["weights"])
        self.assertEqual(sorted(woken), sorted(self.vas))
        for a in adapter.allocations("weights"):
            self.assertTrue(self.exporter.is_exportable(a))
            self.assertEqual(ctypes.string_at(a.va, 8), bytes(8))  # fresh memory: empty
        kv = adapter.allocations("kv_cache")[0]
        self.assertEqual(kv.handle, 0)  # other tags still go through vLLM's own create
        self.assertEqual(mode, adapter.install_hooks("weights", None, None, None, None))  # installing twice is harmless

    def fail_hook(self, where, exc):
        raise AssertionError(f"hook {where} failed: {exc}")

    def test_level_one_sleep_keeps_bytes_through_rehome(self):
        self.exporter.make_all_exportable(adapter.allocations("weights"))
        self.allocator.sleep(offload_tags=("weights",))
        self.allocator.wake_up(None)
        for va in self.vas:
            self.assertEqual(ctypes.string_at(va, 4), bytes([self.fill[va]]) * 4)


if __name__ == "__main__":
    unittest.main()
