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

from . import gd1, settings


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


class _ThreadState(threading.local):
    """Per thread: whether a context was made current here, and the out-parameters of the calls
    (made once, passed by a reference made once: no ctypes object per call)."""

    def __init__(self):
        self.ready = False
        self.u64 = ctypes.c_uint64()
        self.u64_ref = ctypes.byref(self.u64)
        self.fd = ctypes.c_int(-1)
        self.fd_ref = ctypes.byref(self.fd)


class CudaDriver:
    """CUDA driver calls through ctypes. A thread's first call makes sure a context is current
    (the primary context of the allocation's device when the thread has none, as vLLM's own C
    extension does before each call); later calls on that thread go straight to the driver. A
    call that fails checks again: where no context is current any more, one is made current and
    the call is made once more, so a context dropped meanwhile gives the answer the check before
    every call gave. The allocation properties and the access descriptor are built once per
    device (the driver only reads them)."""

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
        # The per-region calls, kept bound (one attribute lookup a call) and given pointers made
        # once (ctypes only checks a reference's type), handles and sizes as plain integers.
        self._create = self._sig("cuMemCreate", [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.POINTER(_AllocationProp), u64])
        self._release = self._sig("cuMemRelease", [u64])
        self._export = self._sig("cuMemExportToShareableHandle", [vp, u64, i32, u64])
        self._import = self._sig("cuMemImportFromShareableHandle", [ctypes.POINTER(u64), vp, i32])
        self._sig("cuMemAddressReserve", [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.c_size_t, u64, u64])
        self._sig("cuMemAddressFree", [u64, ctypes.c_size_t])
        self._map = self._sig("cuMemMap", [u64, ctypes.c_size_t, ctypes.c_size_t, u64, u64])
        self._unmap = self._sig("cuMemUnmap", [u64, ctypes.c_size_t])
        self._set_access = self._sig("cuMemSetAccess", [u64, ctypes.c_size_t, ctypes.POINTER(_AccessDesc), ctypes.c_size_t])
        self._sig("cuMemcpyDtoD_v2", [u64, u64, ctypes.c_size_t])
        self._sig("cuMemcpy", [u64, u64, ctypes.c_size_t])
        self._sig("cuMemHostRegister_v2", [vp, ctypes.c_size_t, ctypes.c_uint])
        self._sig("cuMemHostUnregister", [vp])
        self._sig("cuMemGetAllocationPropertiesFromHandle", [ctypes.POINTER(_AllocationProp), u64])
        self._check(self._cu.cuInit(0), "cuInit")
        self._contexts = {}
        self._lock = threading.Lock()
        self._thread = _ThreadState()
        self._props = {}  # device -> (CUmemAllocationProp, a reference to it): POSIX-FD exportable, pinned, on that device
        self._access = {}  # device -> (CUmemAccessDesc, a reference to it): read-write from that device
        self._kernels = {}  # device -> (the digest kernel, its stream, the module image)
        self._digest_calls = None
        self._scratch = {}  # device -> (address, bytes): the digest's partial sums, kept between calls
        self._tables = {}  # (spans, chunk size) -> the digest's region table and block counts, the latest few

    def _sig(self, name, argtypes):
        fn = getattr(self._cu, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn

    def _check(self, result, call):
        if result != 0:
            name = ctypes.c_char_p()
            self._cu.cuGetErrorName(result, ctypes.byref(name))
            text = name.value.decode() if name.value else str(result)
            if call == "cuMemExportToShareableHandle" and result in _NOT_EXPORTABLE_ERRORS:
                raise NotExportable(f"{call} failed with {text}: the memory was not created exportable")
            raise DriverError(f"{call} failed with {text}")

    def _again(self, device, call, result, fn, *args):
        """A call that answered `result` (not success) on a thread whose context was made current
        once: if none is current any more, one is made current and the call is made again, as the
        check every call made before did; the failure (or the second one) is raised."""
        if self.ensure_context(device):
            result = fn(*args)
        self._check(result, call)

    def ensure_context(self, device):
        """Makes the primary context of `device` current on this thread if none is; True if it did."""
        current = ctypes.c_void_p()
        self._check(self._cu.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if not current.value:
            with self._lock:
                ctx = self._contexts.get(device)
                if ctx is None:
                    dev = ctypes.c_int()
                    self._check(self._cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
                    ctx = ctypes.c_void_p()
                    self._check(self._cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
                    self._contexts[device] = ctx
            self._check(self._cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._thread.ready = True
        return not current.value

    def _ready(self, device):
        """This thread's state, a context made current first if this thread never had one."""
        t = self._thread
        if not t.ready:
            self.ensure_context(device)
        return t

    def _prop(self, device):
        """The allocation properties for exportable memory on `device` and a reference to them."""
        found = self._props.get(device)
        if found is None:
            prop = _AllocationProp()
            prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
            prop.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            prop.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = device
            found = self._props[device] = (prop, ctypes.byref(prop))
        return found[1]

    def _access_ref(self, device):
        found = self._access.get(device)
        if found is None:
            access = _AccessDesc()
            access.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = device
            access.flags = _CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            found = self._access[device] = (access, ctypes.byref(access))
        return found[1]

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
        t = self._ready(device)
        result = self._export(t.fd_ref, handle, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        if result:
            self._again(device, "cuMemExportToShareableHandle", result, self._export, t.fd_ref, handle, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        return t.fd.value

    def export_fds(self, device, handles):
        """export_fd for each of `handles` (all on `device`), in order; on a failure the
        descriptors made so far are closed and the failure is raised with the index that failed
        (`.index` on the exception)."""
        t = self._ready(device)
        export, ref, fd, posix = self._export, t.fd_ref, t.fd, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        fds = []
        try:
            for handle in handles:
                result = export(ref, handle, posix, 0)
                if result:
                    self._again(device, "cuMemExportToShareableHandle", result, export, ref, handle, posix, 0)
                fds.append(fd.value)
        except Exception as e:
            for f in fds:
                os.close(f)
            e.index = len(fds)
            raise
        return fds

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
        t = self._ready(device)
        prop = self._prop(device)
        result = self._create(t.u64_ref, size, prop, 0)
        if result:
            self._again(device, "cuMemCreate", result, self._create, t.u64_ref, size, prop, 0)
        return t.u64.value

    def create_mapped(self, device, va, size):
        """create_exportable + map at `va` in one call (what a wake does per region); the new
        memory is released if the map fails. Returns the handle."""
        t = self._ready(device)
        prop = self._prop(device)
        result = self._create(t.u64_ref, size, prop, 0)
        if result:
            self._again(device, "cuMemCreate", result, self._create, t.u64_ref, size, prop, 0)
        handle = t.u64.value
        try:
            self._map_ready(device, va, size, handle)
        except Exception:
            self.release(device, handle)
            raise
        return handle

    def import_fd(self, fd):
        t = self._thread  # no context is made current for an import (none ever was)
        result = self._import(t.u64_ref, fd, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        if result:
            self._check(result, "cuMemImportFromShareableHandle")
        return t.u64.value

    def reserve(self, device, size):
        self.ensure_context(device)
        va = ctypes.c_uint64()
        self._check(self._cu.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0), "cuMemAddressReserve")
        return va.value

    def free_address(self, device, va, size):
        self.ensure_context(device)
        self._check(self._cu.cuMemAddressFree(va, size), "cuMemAddressFree")

    def map(self, device, va, size, handle):
        self._ready(device)
        self._map_ready(device, va, size, handle)

    def _map_ready(self, device, va, size, handle):
        result = self._map(va, size, 0, handle, 0)
        if result:
            self._again(device, "cuMemMap", result, self._map, va, size, 0, handle, 0)
        access = self._access_ref(device)
        result = self._set_access(va, size, access, 1)
        if result:
            self._again(device, "cuMemSetAccess", result, self._set_access, va, size, access, 1)

    def unmap(self, device, va, size):
        self._ready(device)
        result = self._unmap(va, size)
        if result:
            self._again(device, "cuMemUnmap", result, self._unmap, va, size)

    def release(self, device, handle):
        self._ready(device)
        result = self._release(handle)
        if result:
            self._again(device, "cuMemRelease", result, self._release, handle)

    def copy(self, device, dst, src, size):
        self.ensure_context(device)
        self._check(self._cu.cuMemcpyDtoD_v2(dst, src, size), "cuMemcpyDtoD")
        self._check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def copy_host(self, device, dst, src, size):
        """A copy between device memory and host memory of this process (either way, unified
        addressing tells which is which), finished when it returns."""
        self.ensure_context(device)
        self._check(self._cu.cuMemcpy(dst, src, size), "cuMemcpy")
        self._check(self._cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def host_register(self, device, address, size):
        """Page-locks host memory of this process for DMA (copies from and to it then run at the
        link's rate); False where the driver refuses (the copies then go through pageable memory)."""
        self.ensure_context(device)
        return self._cu.cuMemHostRegister_v2(ctypes.c_void_p(address), size, 0) == 0

    def host_unregister(self, device, address):
        self.ensure_context(device)
        self._cu.cuMemHostUnregister(ctypes.c_void_p(address))

    # ---- the GPU digest (vsnap-gd1) of memory mapped in this process

    def can_digest(self):
        return os.path.exists(gd1.FATBIN)

    def _digest_kernel(self, device):
        """vsnap's digest kernel in `device`'s primary context and a non-blocking stream, made once
        (bound lazily: a driver that never digests needs none of these entry points)."""
        found = self._kernels.get(device)
        if found is not None:
            return found
        self.ensure_context(device)
        u64, vp = ctypes.c_uint64, ctypes.c_void_p
        if not self._digest_calls:
            self._digest_calls = {
                "load": self._sig("cuModuleLoadData", [ctypes.POINTER(vp), ctypes.c_char_p]),
                "function": self._sig("cuModuleGetFunction", [ctypes.POINTER(vp), vp, ctypes.c_char_p]),
                "stream": self._sig("cuStreamCreate", [ctypes.POINTER(vp), ctypes.c_uint]),
                "launch": self._sig("cuLaunchKernel", [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]),
                "alloc": self._sig("cuMemAlloc_v2", [ctypes.POINTER(u64), ctypes.c_size_t]),
                "free": self._sig("cuMemFree_v2", [u64]),
                "fetch": self._sig("cuMemcpyDtoHAsync_v2", [vp, u64, ctypes.c_size_t, vp]),
                "upload": self._sig("cuMemcpyHtoDAsync_v2", [u64, vp, ctypes.c_size_t, vp]),
                "sync": self._sig("cuStreamSynchronize", [vp]),
                "copy": self._sig("cuMemcpyAsync", [u64, u64, ctypes.c_size_t, vp]),
            }
        c = self._digest_calls
        with open(gd1.FATBIN, "rb") as f:
            image = f.read()
        module, fn, stream = vp(), vp(), vp()
        self._check(c["load"](ctypes.byref(module), image), "cuModuleLoadData (digest kernel)")
        self._check(c["function"](ctypes.byref(fn), module, b"vsnap_digest_spans"), "cuModuleGetFunction (vsnap_digest_spans)")
        self._check(c["stream"](ctypes.byref(stream), 1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
        found = self._kernels[device] = (fn, stream, image)  # the image is kept while the module lives
        return found

    def digest_many(self, device, spans, chunk_size):
        """vsnap-gd1 digests of each (va, size) of `spans`, device memory mapped in this process on
        `device`, chunk by chunk: one kernel launch for all the spans (each block finds its span in
        a table uploaded beside the partial sums), one copy of the partial sums back, finished
        here. A list of digest lists, in the order of `spans`. One launch a span ran a small region
        on a few blocks, one region after the other: 877 regions took 150 ms, the bytes alone a few.
        The scratch memory stays allocated between calls (a free would wait for the device), and
        the table is built once for a set of spans: a suspend's dirty check digests the same
        regions every time."""
        return self.digest_start(device, spans, chunk_size)()

    def digest_start(self, device, spans, chunk_size):
        """digest_many in two steps: the kernel launched now, and a function that waits for it
        and returns the digests (other work of the caller runs while the GPU digests). The caller
        must call it, on its failure paths too: the next digest reuses the scratch memory."""
        gd1.check_chunk_size(chunk_size)
        fn, stream, _ = self._digest_kernel(device)
        c = self._digest_calls
        key = (tuple(spans), chunk_size)
        found = self._tables.pop(key, None) or gd1.span_table(spans, chunk_size)
        self._tables[key] = found
        while len(self._tables) > 8:
            del self._tables[next(iter(self._tables))]
        plans, table, blocks = found
        if blocks > 0x7FFFFFFF:
            raise DriverError("too many regions for one digest launch")
        if blocks == 0:
            return lambda: [[] for _ in spans]
        table_bytes = ctypes.sizeof(table)
        scratch = self._digest_scratch(device, blocks * 16 + table_bytes)
        values = [ctypes.c_uint64(scratch + blocks * 16), ctypes.c_uint32(len(table)), ctypes.c_uint64(gd1.SPAN_BYTES), ctypes.c_uint64(scratch)]
        args = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        try:
            self._check(c["upload"](scratch + blocks * 16, ctypes.addressof(table), table_bytes, stream), "cuMemcpyHtoDAsync (digest regions)")
            self._check(c["launch"](fn, blocks, 1, 1, gd1.THREADS, 1, 1, 0, stream, args, None), "cuLaunchKernel (digest)")
            partials = gd1.partials_buffer(2 * blocks)
            self._check(c["fetch"](gd1.buffer_address(partials), scratch, blocks * 16, stream), "cuMemcpyDtoHAsync (digest partials)")
        except BaseException:
            c["sync"](stream)  # what was queued finishes before the scratch is used again
            raise

        def finish():
            self._check(c["sync"](stream), "cuStreamSynchronize")
            out, at = [], 0
            for size, per_chunk, n in plans:
                out.append(gd1.finish_partials(partials[2 * at: 2 * (at + n)], size, chunk_size, per_chunk))
                at += n
            return out

        return finish

    def restore_start(self, device, copies, chunk_size):
        """Each (dst, src, size) of `copies`, host memory of this process copied into device memory
        on `device`, queued on the digest's stream, and the digest of what they wrote launched
        behind them (stream order: after the last copy): digest_start's two steps, the copies and
        the digest waited for once, in the function returned, never once a region. The digest is
        one launch that reads the bytes where they landed, in device memory; a copy that cannot be
        queued drains what was, and raises."""
        self.ensure_context(device)
        _, stream, _ = self._digest_kernel(device)
        c = self._digest_calls
        try:
            for dst, src, size in copies:
                self._check(c["copy"](dst, src, size, stream), "cuMemcpyAsync")
        except BaseException:
            c["sync"](stream)  # what was queued finishes before its memory is released
            raise
        return self.digest_start(device, [(dst, size) for dst, _, size in copies], chunk_size)

    def _digest_scratch(self, device, size):
        """Device memory for `size` bytes (partial sums and the region table) on `device`: the last call's, or a larger one."""
        found = self._scratch.get(device)
        if found is not None and found[1] >= size:
            return found[0]
        c = self._digest_calls
        if found is not None:
            self._scratch.pop(device)
            c["free"](found[0])  # idle: every call waits for its stream before returning
        scratch = ctypes.c_uint64()
        self._check(c["alloc"](ctypes.byref(scratch), size), "cuMemAlloc (digest partials)")
        self._scratch[device] = (scratch.value, size)
        return scratch.value


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

    def can_digest(self):
        return gd1.numpy_available()

    def digest_many(self, device, spans, chunk_size):
        """vsnap-gd1 digests of each (va, size) of `spans`, host memory mapped in this process."""
        gd1.check_chunk_size(chunk_size)
        return [gd1.digest_host(va, size, chunk_size) for va, size in spans]

    def digest_start(self, device, spans, chunk_size):
        """digest_many, as the CUDA driver's two steps (here the digests are taken at once)."""
        digests = self.digest_many(device, spans, chunk_size)
        return lambda: digests

    def restore_start(self, device, copies, chunk_size):
        """CudaDriver.restore_start's copies, made at once, and the digests of what they wrote."""
        for dst, src, size in copies:
            self.copy_host(device, dst, src, size)
        return self.digest_start(device, [(dst, size) for dst, _, size in copies], chunk_size)

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

    def create_mapped(self, device, va, size):
        handle = self.create_exportable(device, size)
        try:
            self.map(device, va, size, handle)
        except Exception:
            self.release(device, handle)
            raise
        return handle

    def export_fds(self, device, handles):
        fds = []
        try:
            for handle in handles:
                fds.append(self.export_fd(device, handle))
        except Exception as e:
            for fd in fds:
                os.close(fd)
            e.index = len(fds)
            raise
        return fds

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

    def copy_host(self, device, dst, src, size):
        ctypes.memmove(dst, src, size)

    def host_register(self, device, address, size):
        return False  # host memory: nothing to page-lock for

    def host_unregister(self, device, address):
        pass


def default_driver():
    """The driver for this process: host memory when VSNAP_VLLM_HOST_MEMORY=1 (the CPU test
    engine), else CUDA."""
    if settings.host_memory():
        return HostDriver()
    return CudaDriver()
