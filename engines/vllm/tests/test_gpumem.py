"""processBytes (gpumem.py): NVML's per-process used memory read through ctypes, on a stand-in
library that answers the way nvml.h specifies (count first, INSUFFICIENT_SIZE, then the list)."""

import ctypes
import threading
import time
import unittest

from tests import support  # noqa: F401
from vsnap_vllm import gpumem


def _deref(arg):
    return arg._obj  # what ctypes.byref() wraps


class FakeNvml:
    """nvmlInit_v2, nvmlDeviceGetHandleByUUID, nvmlDeviceGetComputeRunningProcesses_v3."""

    def __init__(self, processes, uuid=b"GPU-1", init_rc=0, grow_once=False):
        self.processes, self.uuid, self.init_rc, self.grow_once = list(processes), uuid, init_rc, grow_once
        self.calls = 0

    def nvmlInit_v2(self):
        return self.init_rc

    def nvmlDeviceGetHandleByUUID(self, uuid, handle_ref):
        if uuid != self.uuid:
            return 13  # NVML_ERROR_NOT_FOUND
        _deref(handle_ref).value = 0x1234
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count_ref, infos):
        self.calls += 1
        if self.grow_once and self.calls == 2:  # a process started between the two calls
            self.processes.append((999, 1))
            self.grow_once = False
        count = _deref(count_ref)
        if infos is None or count.value < len(self.processes):
            count.value = len(self.processes)
            return gpumem.NVML_ERROR_INSUFFICIENT_SIZE if self.processes else 0
        for i, (pid, used) in enumerate(self.processes):
            infos[i].pid, infos[i].usedGpuMemory = pid, used
        count.value = len(self.processes)
        return 0


class NvmlTest(unittest.TestCase):
    def test_reads_this_pid_only(self):
        n = gpumem.Nvml(FakeNvml([(10, 5 << 30), (42, 750 << 20)]))
        self.assertEqual(n.process_used_bytes("GPU-1", 42), 750 << 20)
        self.assertIsNone(n.process_used_bytes("GPU-1", 7))  # not listed (checkpointed, other namespace)
        self.assertIsNone(n.process_used_bytes("GPU-2", 42))  # unknown device

    def test_a_list_that_grows_between_calls(self):
        n = gpumem.Nvml(FakeNvml([(42, 3)] + [(100 + i, 1) for i in range(8)], grow_once=True))
        self.assertEqual(n.process_used_bytes("GPU-1", 42), 3)

    def test_init_failure(self):
        with self.assertRaises(OSError):
            gpumem.Nvml(FakeNvml([], init_rc=1))


class ProcessMemoryTest(unittest.TestCase):
    def test_less_the_weights_then_remembered(self):
        fake = FakeNvml([(42, 10 << 30)])
        pm = gpumem.ProcessMemory(lambda: gpumem.Nvml(fake))
        self.assertEqual(pm.read("GPU-1", 9 << 30, pid=42), {"processBytes": 1 << 30, "processBytesSource": "nvml"})
        fake.processes = []  # checkpointed: no longer listed
        self.assertEqual(pm.read("GPU-1", 0, pid=42), {"processBytes": 1 << 30, "processBytesSource": "last"})

    def test_never_read(self):
        pm = gpumem.ProcessMemory(lambda: None)  # no libnvidia-ml
        self.assertEqual(pm.read("GPU-1", 0), {"processBytes": None, "processBytesSource": None})

    def test_a_reading_blocked_in_the_driver_answers_with_the_last_one(self):
        # a checkpointed process: NVML does not return until the process is restored
        fake = FakeNvml([(42, 10 << 30)])
        pm = gpumem.ProcessMemory(lambda: gpumem.Nvml(fake), timeout=0.05)
        self.assertEqual(pm.read("GPU-1", 9 << 30, pid=42)["processBytes"], 1 << 30)
        gate = threading.Event()
        real = fake.nvmlDeviceGetComputeRunningProcesses_v3

        def blocked(*a):
            gate.wait(5)
            return real(*a)

        fake.nvmlDeviceGetComputeRunningProcesses_v3 = blocked
        started = time.monotonic()
        self.assertEqual(pm.read("GPU-1", 0, pid=42), {"processBytes": 1 << 30, "processBytesSource": "last"})
        self.assertEqual(pm.read("GPU-1", 0, pid=42), {"processBytes": 1 << 30, "processBytesSource": "last"})  # no second thread
        self.assertLess(time.monotonic() - started, 2)
        gate.set()
        pm._pending.join(5)
        fake.nvmlDeviceGetComputeRunningProcesses_v3 = real
        self.assertEqual(pm.read("GPU-1", 9 << 30, pid=42)["processBytesSource"], "nvml")

    def test_never_negative(self):
        pm = gpumem.ProcessMemory(lambda: gpumem.Nvml(FakeNvml([(42, 1 << 20)])))
        self.assertEqual(pm.read("GPU-1", 5 << 20, pid=42)["processBytes"], 0)


class StructTest(unittest.TestCase):
    def test_layout_of_nvml_process_info(self):
        # nvml.h nvmlProcessInfo_v2_t: unsigned int pid; unsigned long long usedGpuMemory; two unsigned ints
        self.assertEqual(ctypes.sizeof(gpumem.ProcessInfo), 24)
        self.assertEqual(gpumem.ProcessInfo.usedGpuMemory.offset, 8)


from tests import test_hooks  # noqa: E402


class StatusTest(test_hooks.HookFailureTest):
    """The bridge's status: processBytes per rank, less the weights while they are mapped. Only
    these tests run here (the inherited hook-failure tests are removed below)."""

    def test_host_memory_reports_none(self):
        worker = self.load()
        status = self.bridge.status(worker)
        self.assertIsNone(status["processBytes"])
        self.assertIsNone(status["processBytesSource"])

    def test_cuda_reads_nvml_less_the_weights(self):
        import os

        worker = self.load()
        self.bridge.driver.kind = "cuda"  # this instance only: the status reads NVML for a CUDA worker
        weights = self.bridge.status(worker)["bytes"]
        fake = FakeNvml([(os.getpid(), weights + (700 << 20))], uuid=self.bridge._device_uuid(0).encode())
        self.bridge.process_memory = gpumem.ProcessMemory(lambda: gpumem.Nvml(fake))
        awake = self.bridge.status(worker)
        self.assertEqual((awake["processBytes"], awake["processBytesSource"]), (700 << 20, "nvml"))
        worker.sleep(2)
        fake.processes = [(os.getpid(), 750 << 20)]
        self.assertEqual(self.bridge.status(worker)["processBytes"], 750 << 20)
        fake.processes = []  # checkpointed
        asleep = self.bridge.status(worker)
        self.assertEqual((asleep["processBytes"], asleep["processBytesSource"]), (750 << 20, "last"))
        worker.wake_up(None)


for _name in [n for n in dir(test_hooks.HookFailureTest) if n.startswith("test_")]:
    if not hasattr(StatusTest, _name) or getattr(StatusTest, _name) is getattr(test_hooks.HookFailureTest, _name):
        setattr(StatusTest, _name, None)


if __name__ == "__main__":
    unittest.main()
