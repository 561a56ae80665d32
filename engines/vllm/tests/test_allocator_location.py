"""The allocator module is found where CuMemAllocator is defined, not where a compatibility shim
re-exports it (newest vLLM: vllm/backends/platform/device_allocator/cumem.py, with lazy
__getattr__ shims at the old vllm/device_allocator paths): the wrapped create_and_map must be the
one the allocator's own sleep/wake call."""

import sys
import types
import unittest

from tests import support  # noqa: F401
from vsnap_vllm import adapter

NEW = "vllm.backends.platform.device_allocator"


class AllocatorLocationTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in (NEW, NEW + ".cumem", "vllm.device_allocator", "vllm.device_allocator.cumem")}
        real_pkg = types.ModuleType(NEW)
        real_pkg.__path__ = []
        real = types.ModuleType(NEW + ".cumem")
        exec(
            "class CuMemAllocator:\n"
            "    instance = None\n"
            "    def wake(self, handle):\n"
            "        create_and_map(handle)\n"
            "created = []\n"
            "def create_and_map(handle):\n"
            "    created.append(handle)\n"
            "def unmap_and_release(handle):\n"
            "    pass\n",
            real.__dict__,
        )
        real.CuMemAllocator.__module__ = NEW + ".cumem"
        shim_pkg = types.ModuleType("vllm.device_allocator")
        shim_pkg.__path__ = []
        shim_pkg.__getattr__ = lambda name: getattr(real_pkg, name)
        shim = types.ModuleType("vllm.device_allocator.cumem")  # a lazy delegation shim: its own module object
        shim.__getattr__ = lambda name: getattr(real, name)
        sys.modules.update({NEW: real_pkg, NEW + ".cumem": real, "vllm.device_allocator": shim_pkg, "vllm.device_allocator.cumem": shim})
        self.real = real

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v

    def test_the_defining_module_is_wrapped(self):
        self.assertIs(adapter._cumem(), self.real)
        mapped = []

        def on_create(allocation):
            mapped.append(allocation)
            return True

        self.real.CuMemAllocator.instance = types.SimpleNamespace(pointer_to_data={})
        mode = adapter.install_hooks("weights", on_create, None, None, lambda where, e: self.fail(f"{where}: {e}"))
        self.assertEqual(mode, "wrapped create_and_map")
        self.real.CuMemAllocator().wake((0, 4096, 0x1000, 0))  # no such allocation: vLLM's own create runs
        self.assertEqual(self.real.created, [(0, 4096, 0x1000, 0)])  # through the wrapper in the real module
        self.assertTrue(getattr(self.real.create_and_map, "_vsnap_wrapped", False))


if __name__ == "__main__":
    unittest.main()
