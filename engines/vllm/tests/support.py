"""Puts the reference engine's stand-in `vllm` package (test/fixtures/engine) on sys.path, with
host memory, so the plugin's real code runs against an allocator shaped like vLLM's."""

import os
import sys

os.environ.setdefault("VSNAP_REF_DEVICE", "host")
if os.environ["VSNAP_REF_DEVICE"] == "host":  # VSNAP_REF_DEVICE=cuda (the GPU suite running these on the GPU): CUDA memory
    os.environ.setdefault("VSNAP_VLLM_HOST_MEMORY", "1")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FIXTURE = os.path.join(ROOT, "test", "fixtures", "engine")
if FIXTURE not in sys.path:
    sys.path.insert(0, FIXTURE)
PLUGIN = os.path.join(ROOT, "engines", "vllm")
if PLUGIN not in sys.path:
    sys.path.insert(0, PLUGIN)


def free_allocator():
    """Frees every allocation of the stand-in allocator (woken first where asleep) and forgets the
    allocator, so the next test starts with none."""
    from vllm.device_allocator import cumem

    allocator = cumem.CuMemAllocator.instance
    if allocator is not None:
        for va, data in list(allocator.pointer_to_data.items()):
            if data.is_asleep:
                cumem.create_and_map(data.handle)
                data.is_asleep = False
            allocator.host_free(va)
    cumem.CuMemAllocator.instance = None
