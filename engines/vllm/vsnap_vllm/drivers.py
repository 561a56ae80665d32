"""Memory operations behind the bridge, for two kinds of "physical memory":

- CudaDriver: CUDA virtual memory management through ctypes on libcuda.so.1 (the real thing);
- HostDriver: memfd host memory mapped at reserved host addresses, the same model on a machine
  without a GPU (used by vsnap's CPU test engine; selected with VSNAP_VLLM_HOST_MEMORY=1).

Both speak in the allocator's terms: a handle (a CUmemGenericAllocationHandle, or a memfd
number), a virtual address and a size.
"""

import ctypes
import ctypes.util
import mmap
import os
import threading


class DriverError(RuntimeError):
    pass


class NotExportable(DriverError):
    """The handle's memory was not created exportable as a POSIX descriptor."""


# What memory a handle holds, as far as exporting it goes (one per allocation, see exportable.py):
POSIX_FD = "posix-fd"  # requested with a POSIX-FD handle type: exported as it is, no copy
NONE = "none"  # no export handle type (older vLLM): rehomed
FABRIC = "fabric"  # FABRIC handles only (vLLM on IMEX systems, PR #33540): rehomed to POSIX-FD memory


# ---------------------------------------------------------------------------- CUDA

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_HANDLE_TYPE_FABRIC = 8
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CUDA_ERROR_INVALID_VALUE = 1
# What a POSIX export of memory made without that handle type answers: INVALID_VALUE (measured on
# an H200 for memory with no type); NOT_PERMITTED / NOT_SUPPORTED are taken the same way (the
# FABRIC-only case was not measured: no IMEX system was available).
_NOT_EXPORTABLE_ERRORS = (_CUDA_ERROR_INVALID_VALUE, 800, 801)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp: 32 bytes
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc: 12 bytes
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class CudaDriver:
    """CUDA driver calls through ctypes. Every call makes sure a context is current: the
    primary context of the allocation's device when the thread has none (vLLM's own C
    extension does the same)."""

    kind = "cuda"

    def __init__(self, library="libcuda.so.1"):
        try:
            self._cu = ctypes.CDLL(library)
        except OSError as e:
            raise DriverError(f"cannot load {library}: {e}") from e
        u64, i32, vp = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
        self._sig("cuInit", [ctypes.c_uint])
        self._sig("cuGetErrorName", [i32, ctypes.POINTER(ctypes.c_char_p)])
        self._sig("cuDeviceGet", [ctypes.POINTER(i32), i32])
        self._sig("cuDeviceGetUuid_v2", [ctypes.c_char * 16, i32])
        self._sig("cuCtxGetCurrent", [ctypes.POINTER(vp)])
        self._sig("cuCtxSetCurrent", [vp])
        self._sig("cuCtxSynchronize", [])
        self._sig("cuDevicePrimaryCtxRetain", [ctypes.POINTER(vp), i32])
        self._sig("cuMemGetAllocationGranularity", [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(_AllocationProp), i32])
        self._sig("cuMemCreate", [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.POINTER(_AllocationProp), u64])
        self._sig("cuMemRelease", [u64])
        self._sig("cuMemExportToShareableHandle", [vp, u64, i32, u64])
        self._sig("cuMemImportFromShareableHandle", [ctypes.POINTER(u64), vp, i32])
        self._sig("cuMemAddressReserve", [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.c_size_t, u64, u64])
        self._sig("cuMemAddressFree", [u64, ctypes.c_size_t])
        self._sig("cuMemMap", [u64, ctypes.c_size_t, ctypes.c_size_t, u64, u64])
        self._sig("cuMemUnmap", [u64, ctypes.c_size_t])
        self._sig("cuMemSetAccess", [u64, ctypes.c_size_t, ctypes.POINTER(_AccessDesc), ctypes.c_size_t])
        self._sig("cuMemcpyDtoD_v2", [u64, u64, ctypes.c_size_t])
        self._sig("cuMemGetAllocationPropertiesFromHandle", [ctypes.POINTER(_AllocationProp), u64])
        self._check(self._cu.cuInit(0), "cuInit")
        self._contexts = {}
        self._lock = threading.Lock()

    def _sig(self, name, argtypes):
        fn = getattr(self._cu, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int

    def _check(self, result, call):
        if result != 0:
            name = ctypes.c_char_p()
            self._cu.cuGetErrorName(result, ctypes.byref(name))
            text = name.value.decode() if name.value else str(result)
            if call == "cuMemExportToShareableHandle" and result in _NOT_EXPORTABLE_ERRORS:
                raise NotExportable(f"{call} failed with {text}: the memory was not created exportable")
            raise DriverError(f"{call} failed with {text}")

    def ensure_context(self, device):
        current = ctypes.c_void_p()
        self._check(self._cu.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value:
            return
        with self._lock:
            ctx = self._contexts.get(device)
            if ctx is None:
                dev = ctypes.c_int()
                self._check(self._cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
                ctx = ctypes.c_void_p()
                self._check(self._cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
                self._contexts[device] = ctx
        self._check(self._cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _prop(self, device):
        prop = _AllocationProp()
        prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        return prop

    def device_uuid(self, device):
        self.ensure_context(device)
        dev = ctypes.c_int()
        self._check(self._cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        raw = (ctypes.c_char * 16)()
        self._check(self._cu.cuDeviceGetUuid_v2(raw, dev), "cuDeviceGetUuid")
        b = bytes(raw).hex()
        return f"GPU-{b[0:8]}-{b[8:12]}-{b[12:16]}-{b[16:20]}-{b[20:32]}"

    def export_fd(self, device, handle):
        """A new POSIX descriptor for the memory of `handle`; NotExportable if it cannot be."""
        self.ensure_context(device)
        fd = ctypes.c_int(-1)
        self._check(self._cu.cuMemExportToShareableHandle(ctypes.byref(fd), handle, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "cuMemExportToShareableHandle")
        return fd.value

    def handle_kind(self, device, handle):
        """POSIX_FD, FABRIC or NONE, from the handle types the memory was created with."""
        self.ensure_context(device)
        prop = _AllocationProp()
        self._check(self._cu.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(prop), handle), "cuMemGetAllocationPropertiesFromHandle")
        types = prop.requestedHandleTypes
        if types & _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
            return POSIX_FD
        return FABRIC if types & _CU_MEM_HANDLE_TYPE_FABRIC else NONE

    def create_exportable(self, device, size):
        self.ensure_context(device)
        handle = ctypes.c_uint64()
        prop = self._prop(device)
        self._check(self._cu.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), "cuMemCreate")
        return handle.value

    def import_fd(self, fd):
        handle = ctypes.c_uint64()
        self._check(self._cu.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "cuMemImportFromShareableHandle")
        return handle.value

    def reserve(self, device, size):
        self.ensure_context(device)
        va = ctypes.c_uint64()
        self._check(self._cu.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0), "cuMemAddressReserve")
        return va.value

    def free_address(self, device, va, size):
        self.ensure_context(device)
        self._check(self._cu.cuMemAddressFree(va, size), "cuMemAddressFree")

    def map(self, device, va, size, handle):
        self.ensure_context(device)
        self._check(self._cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
        access = _AccessDesc()
        access.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = _CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._check(self._cu.cuMemSetAccess(va, size, ctypes.byref(access), 1), "cuMemSetAccess")

    def unmap(self, device, va, size):
        self.ensure_context(device)
        self._check(self._cu.cuMemUnmap(va, size), "cuMemUnmap")

    def release(self, device, handle):
        self.ensure_context(device)
        self._check(self._cu.cuMemRelease(handle), "cuMemRelease")

    def copy(self, device, dst, src, size):
        self.ensure_context(device)
        self._check(self._cu.cuMemcpyDtoD_v2(dst, src, size), "cuMemcpyDtoD")
        self._check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize")


# ---------------------------------------------------------------------------- host memory

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10
_PROT_NONE = 0


def _mmap(addr, size, prot, flags, fd):
    result = _libc.mmap(ctypes.c_void_p(addr), size, prot, flags, fd, 0)
    if result == _MAP_FAILED or result is None:
        err = ctypes.get_errno()
        raise DriverError(f"mmap failed: {os.strerror(err)}")
    return result


HOST_FABRIC_BIT = 1 << 40
"""Set in a host handle (a memfd number) by the reference engine's allocator when it simulates
FABRIC-only memory: the descriptor exists but may not be exported as a POSIX descriptor."""


class HostDriver:
    """The same operations on host memory: a handle is a memfd (0 for memory made without one,
    which cannot be exported: the analogue of CUDA memory created without an export handle
    type; a memfd with HOST_FABRIC_BIT set: FABRIC-only memory), an address range is reserved
    with a PROT_NONE mapping, mapping places the memfd there
    (MAP_FIXED | MAP_SHARED), and unmapping puts the reservation back, so addresses survive
    sleep as with CUDA VMM."""

    kind = "host"

    def device_uuid(self, device):
        return f"HOST-{device}"

    def export_fd(self, device, handle):
        if handle == 0:
            raise NotExportable("this host memory has no descriptor")
        if handle & HOST_FABRIC_BIT:
            raise NotExportable("this host memory is FABRIC-only (simulated)")
        return os.dup(handle)

    def handle_kind(self, device, handle):
        if handle == 0:
            return NONE
        return FABRIC if handle & HOST_FABRIC_BIT else POSIX_FD

    def create_exportable(self, device, size):
        fd = os.memfd_create("vsnap-region", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd

    def import_fd(self, fd):
        return os.dup(fd)

    def reserve(self, device, size):
        return _mmap(0, size, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1)

    def free_address(self, device, va, size):
        _libc.munmap(ctypes.c_void_p(va), size)

    def map(self, device, va, size, handle):
        _mmap(va, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, handle & ~HOST_FABRIC_BIT)

    def unmap(self, device, va, size):
        _mmap(va, size, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1)

    def release(self, device, handle):
        if handle:
            os.close(handle & ~HOST_FABRIC_BIT)

    def copy(self, device, dst, src, size):
        ctypes.memmove(dst, src, size)


def default_driver():
    """The driver for this process: host memory when VSNAP_VLLM_HOST_MEMORY=1 (the CPU test
    engine), else CUDA."""
    if os.environ.get("VSNAP_VLLM_HOST_MEMORY") == "1":
        return HostDriver()
    return CudaDriver()
