"""Level-1 sleep and wake of the reference engine's Worker (host memory, in-process) through vLLM's
`cumem` sleep-mode backend and vsnap's, alternately, the RAM tier in /dev/shm (kept across the
runs, so the second vsnap run finds the weights there): python3 bench/sleep-backend-cpu.py LAYERS"""

import logging
import shutil
import os
import statistics
import sys
import tempfile
import time
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path[:0] = [os.path.join(ROOT, "engines", "vllm"), os.path.join(ROOT, "test", "fixtures", "engine")]
os.environ["VSNAP_REF_DEVICE"] = "host"
os.environ["VSNAP_VLLM_HOST_MEMORY"] = "1"
import vsnap_vllm
vsnap_vllm.register_sleep_backend(logging.getLogger("x"))
from vllm.device_allocator import cumem
from vllm.v1.worker.gpu_worker import Worker
from vsnap_vllm.ram_tier import RamTier


def free_allocator():
    """Frees every allocation of the stand-in allocator (woken first where asleep), so the next run starts with none."""
    allocator = cumem.CuMemAllocator.instance
    for va, data in list(allocator.pointer_to_data.items()):
        if data.is_asleep:
            cumem.create_and_map(data.handle)
            data.is_asleep = False
        allocator.host_free(va)
    cumem.CuMemAllocator.instance = None


layers = int(sys.argv[1])
d = tempfile.mkdtemp(dir="/dev/shm")
RamTier.init(d, 64 << 30)
os.environ["VSNAP_RAM_TIER"] = d
for backend in ("cumem", "vsnap", "cumem", "vsnap"):
    cumem.CuMemAllocator.instance = None
    w = Worker(types.SimpleNamespace(model="m", revision="r", dtype="bfloat16", seed=3, layers=layers, enable_sleep_mode=True, keeps_workspace=False, sleep_mode_offload_cudagraph=False, sleep_mode_backend=backend))
    w.load_model()
    w.initialize_cache()
    size = sum(x.handle[1] for x in cumem.CuMemAllocator.get_instance().pointer_to_data.values() if x.tag == "weights")
    rows = []
    for i in range(4):
        t0 = time.perf_counter()
        w.sleep(1)
        t1 = time.perf_counter()
        w.wake_up(None)
        rows.append((t1 - t0, time.perf_counter() - t1))
    print(f"{backend}: weights {size/2**20:.1f} MiB; first sleep {rows[0][0]*1e3:.1f} ms; later sleeps median {statistics.median(r[0] for r in rows[1:])*1e3:.1f} ms; wakes median {statistics.median(r[1] for r in rows)*1e3:.1f} ms")
    free_allocator()
shutil.rmtree(d, ignore_errors=True)
