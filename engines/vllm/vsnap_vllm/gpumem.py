"""This process's GPU memory as the driver accounts it, through NVML (libnvidia-ml.so.1, loaded
with ctypes: no pynvml needed). nvmlDeviceGetComputeRunningProcesses_v3 lists the compute
processes on a device with their used memory (nvml.h: nvmlProcessInfo_t = pid, usedGpuMemory,
gpuInstanceId, computeInstanceId). It does not go through a CUDA context, so it answers while the
process is locked or checkpointed (it is then not listed). Inside a PID namespace NVML reports
host pids: this process is not found and the answer is None."""

import ctypes
import os
import threading

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """NVML calls on one loaded library (`lib`: a ctypes.CDLL, or a stand-in in tests)."""

    def __init__(self, lib):
        self.lib = lib
        self._lock = threading.Lock()
        self._handles = {}
        if lib.nvmlInit_v2() != NVML_SUCCESS:
            raise OSError("nvmlInit_v2 failed")

    def _handle(self, uuid):
        if uuid not in self._handles:
            handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != NVML_SUCCESS:
                return None
            self._handles[uuid] = handle
        return self._handles[uuid]

    def process_used_bytes(self, uuid, pid):
        """GPU memory `pid` uses on the device `uuid`, in bytes; None when NVML cannot say or the
        process is not listed there."""
        with self._lock:
            handle = self._handle(uuid)
            if handle is None:
                return None
            count = ctypes.c_uint(0)
            rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)
            if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE) or (rc == NVML_SUCCESS and count.value == 0):
                return None  # an error, or no process listed: nothing to look up
            for _ in range(3):  # processes may start between the two calls
                count = ctypes.c_uint(count.value + 8)
                infos = (ProcessInfo * count.value)()
                rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos)
                if rc == NVML_SUCCESS:
                    break
                if rc != NVML_ERROR_INSUFFICIENT_SIZE:
                    return None
            else:
                return None
            for info in infos[:count.value]:
                if info.pid == pid:
                    return int(info.usedGpuMemory)
        return None


_NVML = None
_NVML_FAILED = False


def nvml():
    """The process-wide Nvml, or None where libnvidia-ml.so.1 is missing or does not start."""
    global _NVML, _NVML_FAILED
    if _NVML is None and not _NVML_FAILED:
        try:
            _NVML = Nvml(ctypes.CDLL("libnvidia-ml.so.1"))
        except (OSError, AttributeError):
            _NVML_FAILED = True
    return _NVML


class ProcessMemory:
    """What the status reports as `processBytes`: this process's GPU memory outside its weights
    (NVML's used memory of this pid, less the weights bytes while they are mapped), remembered: a
    checkpointed process is not listed by NVML, and the last reading is what its restore will
    recreate. `source`: "nvml" (read now), "last" (remembered), None (never read)."""

    def __init__(self, nvml_fn=nvml, timeout=0.25):
        self._nvml_fn = nvml_fn
        self._timeout = timeout
        self._lock = threading.Lock()
        self._pending = None  # a reading still running (blocked in the driver), never two at once
        self.last = None

    def remembered(self):
        return {"processBytes": self.last, "processBytesSource": "last" if self.last is not None else None}

    def read(self, uuid, weights_bytes_mapped, pid=None):
        """Reads NVML on a helper thread and waits at most `timeout` seconds: in a process the
        driver has locked or checkpointed (deep suspend), the call blocks until its restore (seen
        on an H200, driver 580: the status RPC hung), and the remembered reading is the answer."""
        with self._lock:
            if self._pending is not None and self._pending.is_alive():
                return self.remembered()
            box = {}

            def run():
                try:
                    n = self._nvml_fn() if uuid else None
                    used = n.process_used_bytes(uuid, os.getpid() if pid is None else pid) if n is not None else None
                    if used is not None:  # remembered also when it comes too late for this call
                        self.last = max(0, used - weights_bytes_mapped)
                    box["read"] = used is not None
                except Exception as e:  # noqa: BLE001 - a reading, reported by the caller
                    box["error"] = e

            self._pending = threading.Thread(target=run, name="vsnap-nvml", daemon=True)
            self._pending.start()
        self._pending.join(self._timeout)
        if "error" in box:
            raise box["error"]
        if box.get("read"):
            return {"processBytes": self.last, "processBytesSource": "nvml"}
        return self.remembered()
