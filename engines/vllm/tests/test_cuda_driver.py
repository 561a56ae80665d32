"""CudaDriver's ctypes side against a stand-in libcuda (fake_libcuda.c, built here with cc; the
tests are skipped without a C compiler): the structures each call passes, the context made
current once per thread and again when it was dropped, and every error path (NotExportable for
the codes a POSIX export of memory made without that handle type answers, DriverError for the
others, memory released when its map fails, descriptors closed when a batch fails), and the
digest (one launch a call, its stream drained when a step fails, its scratch memory kept)."""

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

from tests import support  # noqa: F401
from vsnap_vllm.adapter import Allocation
from vsnap_vllm.drivers import CudaDriver, DriverError, NotExportable, _AccessDesc, _AllocationProp
from vsnap_vllm.exportable import Exporter

HERE = os.path.dirname(os.path.abspath(__file__))
INVALID_VALUE, OUT_OF_MEMORY, INVALID_CONTEXT, NOT_PERMITTED, NOT_SUPPORTED = 1, 2, 201, 800, 801
_LIB = None
_DIR = None


def fake_lib():
    global _LIB, _DIR
    if _LIB is None:
        _DIR = tempfile.mkdtemp(prefix="vsnap-fake-cuda-")
        path = os.path.join(_DIR, "libfakecuda.so")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", path, os.path.join(HERE, "fake_libcuda.c")], check=True)
        _LIB = path
    return _LIB


def tearDownModule():
    if _DIR:
        shutil.rmtree(_DIR, ignore_errors=True)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@unittest.skipUnless(shutil.which("cc"), "needs a C compiler for the stand-in libcuda")
class CudaDriverTest(unittest.TestCase):
    def setUp(self):
        self.path = fake_lib()
        self.fake = ctypes.CDLL(self.path)
        self.fake.fake_calls.restype = ctypes.c_long
        self.fake.fake_reset()
        self.driver = CudaDriver(library=self.path)

    def calls(self, name):
        return self.fake.fake_calls(name.encode())

    def inject(self, name, code, times=1):
        """The next `times` calls of `name` answer `code` (not TestCase.fail, which assertions call)."""
        self.fake.fake_fail(name.encode(), code, ctypes.c_long(times))

    def allocations(self, n, device=0):
        self.slots = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(self.slots)
        return [Allocation(device=device, size=2 << 20, va=0x7F0000000000 + i * (2 << 20), handle_slot=base + 8 * i, tag="weights") for i in range(n)]

    def test_create_passes_exportable_pinned_memory_of_the_device_and_read_write_access(self):
        for device in (0, 3, 0):
            handle = self.driver.create_mapped(device, 0x7F0000000000, 2 << 20)
            self.assertNotEqual(handle, 0)
            prop, access = _AllocationProp(), _AccessDesc()
            self.fake.fake_last_prop(ctypes.byref(prop))
            self.fake.fake_last_access(ctypes.byref(access))
            self.assertEqual((prop.type, prop.requestedHandleTypes, prop.location.type, prop.location.id), (1, 1, 1, device))
            self.assertEqual((access.location.type, access.location.id, access.flags), (1, device, 3))
        self.assertNotEqual(self.driver.create_exportable(0, 2 << 20), handle)  # a new handle each time

    def test_a_context_is_made_current_once_per_thread(self):
        for _ in range(5):
            handle = self.driver.create_mapped(0, 0x7F0000000000, 2 << 20)
            self.driver.export_fd(0, handle)
        self.assertEqual(self.calls("cuCtxGetCurrent"), 1)
        self.assertEqual(self.calls("cuCtxSetCurrent"), 1)  # this thread had none
        self.assertEqual(self.calls("cuDevicePrimaryCtxRetain"), 1)
        other = threading.Thread(target=lambda: self.driver.export_fds(0, [1, 2, 3]))
        other.start()
        other.join()
        self.assertEqual(self.calls("cuCtxGetCurrent"), 2)
        self.assertEqual(self.calls("cuCtxSetCurrent"), 2)
        self.assertEqual(self.calls("cuDevicePrimaryCtxRetain"), 1)  # the primary context is retained once per device

    def test_a_context_current_already_is_used(self):
        self.fake.fake_reset()
        self.fake.fake_set_no_context(0)
        self.driver = CudaDriver(library=self.path)
        self.driver.create_mapped(0, 0x7F0000000000, 2 << 20)
        self.assertEqual(self.calls("cuCtxSetCurrent"), 0)

    def test_a_dropped_context_is_made_current_again_and_the_call_repeated(self):
        self.driver.create_mapped(0, 0x7F0000000000, 2 << 20)
        self.fake.fake_drop_context()
        handle = self.driver.create_mapped(0, 0x7F0000000000, 2 << 20)
        self.assertNotEqual(handle, 0)
        self.assertEqual(self.calls("cuMemCreate"), 3)  # the second create failed without a context, then ran again
        self.assertEqual(self.calls("cuCtxSetCurrent"), 2)
        self.fake.fake_drop_context()
        self.assertEqual(len(self.driver.export_fds(0, [1, 2])), 2)

    def test_export_of_memory_made_without_the_handle_type_is_not_exportable(self):
        for code in (INVALID_VALUE, NOT_PERMITTED, NOT_SUPPORTED):
            self.inject("cuMemExportToShareableHandle", code)
            with self.assertRaises(NotExportable):
                self.driver.export_fd(0, 7)
        self.assertEqual(self.calls("cuMemExportToShareableHandle"), 3)  # a context was current: no second try
        self.inject("cuMemExportToShareableHandle", OUT_OF_MEMORY)
        with self.assertRaises(DriverError) as caught:
            self.driver.export_fd(0, 7)
        self.assertNotIsInstance(caught.exception, NotExportable)
        self.assertIn("CUDA_ERROR_OUT_OF_MEMORY", str(caught.exception))

    def test_other_calls_raise_their_error_by_name(self):
        for call, run in (
            ("cuMemCreate", lambda: self.driver.create_exportable(0, 2 << 20)),
            ("cuMemImportFromShareableHandle", lambda: self.driver.import_fd(5)),
            ("cuMemUnmap", lambda: self.driver.unmap(0, 0x7F0000000000, 2 << 20)),
            ("cuMemRelease", lambda: self.driver.release(0, 9)),
            ("cuMemMap", lambda: self.driver.map(0, 0x7F0000000000, 2 << 20, 9)),
        ):
            self.inject(call, OUT_OF_MEMORY)
            with self.assertRaisesRegex(DriverError, f"{call} failed with CUDA_ERROR_OUT_OF_MEMORY"):
                run()
        self.driver.create_exportable(0, 2 << 20)  # the failures were one each

    def test_memory_whose_map_fails_is_released(self):
        for call in ("cuMemMap", "cuMemSetAccess"):
            released = self.calls("cuMemRelease")
            self.inject(call, INVALID_VALUE)
            with self.assertRaisesRegex(DriverError, f"{call} failed with CUDA_ERROR_INVALID_VALUE"):
                self.driver.create_mapped(0, 0x7F0000000000, 2 << 20)
            self.assertEqual(self.calls("cuMemRelease"), released + 1)
        exporter = Exporter(self.driver)
        [a] = self.allocations(1)
        self.inject("cuMemMap", INVALID_VALUE)
        with self.assertRaises(DriverError):
            exporter.create_on_wake(a)
        self.assertEqual(a.handle, 0)  # vLLM's slot untouched
        exporter.create_on_wake(a)
        self.assertNotEqual(a.handle, 0)
        self.assertTrue(exporter.is_exportable(a))

    def test_a_failed_batch_export_closes_what_it_exported(self):
        self.fake.fake_export_real(1)
        exporter = Exporter(self.driver)
        allocations = self.allocations(6)
        for a in allocations:
            exporter.create_on_wake(a)
        fds = exporter.export_fds(allocations)
        self.assertEqual(len(set(fds)), 6)
        for fd in fds:
            os.close(fd)
        before = open_fds()
        calls = self.calls("cuMemExportToShareableHandle")
        self.fake.fake_fail_after(b"cuMemExportToShareableHandle", ctypes.c_long(3), INVALID_VALUE, ctypes.c_long(1))
        with self.assertRaisesRegex(NotExportable, f"weights allocation at {allocations[3].va:#x} is not exportable"):
            exporter.export_fds(allocations)
        self.assertEqual(open_fds(), before)  # the three exported before the failure are closed
        self.assertEqual(self.calls("cuMemExportToShareableHandle"), calls + 4)
        self.fake.fake_fail_after(b"cuMemExportToShareableHandle", ctypes.c_long(2), OUT_OF_MEMORY, ctypes.c_long(1))
        with self.assertRaises(DriverError) as caught:
            exporter.export_fds(allocations)
        self.assertNotIsInstance(caught.exception, NotExportable)
        self.assertEqual(open_fds(), before)

    def test_kept_descriptors_are_copied_beside_the_exports_in_order(self):
        self.fake.fake_export_real(1)
        exporter = Exporter(self.driver)
        allocations = self.allocations(4)
        kept = {}
        for i, a in enumerate(allocations):
            if i % 2:
                fd = os.memfd_create(f"kept-{i}")
                kept[i] = os.fstat(fd).st_ino
                exporter.adopt(a, fd, in_place=False)  # mapped back from a descriptor the SDK handed over
            else:
                exporter.create_on_wake(a)
        fds = exporter.export_fds(allocations)
        try:
            self.assertEqual({i: os.fstat(fds[i]).st_ino for i in kept}, kept)  # the kept memory, not an export
            self.assertEqual(self.calls("cuMemExportToShareableHandle"), 2)
        finally:
            for fd in fds:
                os.close(fd)
            exporter.forget()

    def test_handed_back_descriptors_are_imported_on_threads_and_released_when_one_fails(self):
        from vsnap_vllm import exportable
        exporter = Exporter(self.driver)
        n = exportable.IMPORT_PARALLEL_FROM * 3
        fds = [os.memfd_create(f"handed-{i}") for i in range(n)]
        try:
            before = open_fds()
            handles = exporter.import_all(fds, [0] * n)
            self.assertEqual(len(set(handles)), n)  # one handle each, in order of the descriptors
            self.assertEqual(self.calls("cuMemImportFromShareableHandle"), n)
            for h in handles:
                self.driver.release(0, h)
            # one import fails: the error is raised, every handle imported is released again, the descriptors stay open (the caller's)
            released = self.calls("cuMemRelease")
            imported = self.calls("cuMemImportFromShareableHandle")
            self.fake.fake_fail_after(b"cuMemImportFromShareableHandle", ctypes.c_long(n // 2), OUT_OF_MEMORY, ctypes.c_long(1))
            with self.assertRaises(DriverError):
                exporter.import_all(fds, [0] * n)
            succeeded = self.calls("cuMemImportFromShareableHandle") - imported - 1
            self.assertGreaterEqual(succeeded, n // 2)
            self.assertEqual(self.calls("cuMemRelease") - released, succeeded)
            self.assertEqual(open_fds(), before)
            # a few: one thread, the same failure path
            self.fake.fake_fail_after(b"cuMemImportFromShareableHandle", ctypes.c_long(2), OUT_OF_MEMORY, ctypes.c_long(1))
            released = self.calls("cuMemRelease")
            with self.assertRaises(DriverError):
                exporter.import_all(fds[:4], [0] * 4)
            self.assertEqual(self.calls("cuMemRelease") - released, 2)
            # an allocation adopts a handle imported already: no second import
            [a] = self.allocations(1)
            [h] = exporter.import_all(fds[:1], [0])
            imports = self.calls("cuMemImportFromShareableHandle")
            exporter.adopt(a, os.dup(fds[0]), in_place=False, handle=h)
            self.assertEqual(self.calls("cuMemImportFromShareableHandle"), imports)
            self.assertEqual(self.slots[0], h)
            exporter.forget()
        finally:
            for fd in fds:
                os.close(fd)

    def test_is_exportable_answers_false_for_memory_made_without_the_handle_type(self):
        exporter = Exporter(self.driver)
        [a] = self.allocations(1)
        self.slots[0] = 42
        self.inject("cuMemExportToShareableHandle", INVALID_VALUE)
        self.assertFalse(exporter.is_exportable(a))

    def test_the_digest_is_one_launch_and_a_failed_step_drains_the_stream_and_keeps_the_scratch(self):
        # 50 regions of 4 MiB and an empty one: one table upload, one launch, one read-back a call.
        spans = [(0x7F0000000000 + i * (4 << 20), 4 << 20) for i in range(50)] + [(0x7F1000000000, 0)]
        digests = self.driver.digest_many(0, spans, 64 << 20)
        self.assertEqual([len(d) for d in digests], [1] * 50 + [0])
        self.assertEqual([self.calls(n) for n in ("cuMemcpyHtoDAsync_v2", "cuLaunchKernel", "cuMemcpyDtoHAsync_v2", "cuMemAlloc_v2")], [1, 1, 1, 1])
        for step in ("cuMemcpyHtoDAsync_v2", "cuLaunchKernel", "cuMemcpyDtoHAsync_v2"):
            syncs = self.calls("cuStreamSynchronize")
            self.inject(step, INVALID_VALUE)
            with self.assertRaises(DriverError, msg=step):
                self.driver.digest_start(0, spans, 64 << 20)
            # what was queued finishes before the scratch is used again, and the next call works
            self.assertEqual(self.calls("cuStreamSynchronize"), syncs + 1, step)
            self.assertEqual(len(self.driver.digest_many(0, spans, 64 << 20)), len(spans))
        self.assertEqual((self.calls("cuMemAlloc_v2"), self.calls("cuMemFree_v2")), (1, 0))

    def test_a_restore_queues_every_copy_and_the_digest_on_one_stream_and_waits_once(self):
        copies = [(0x7F0000000000 + i * (4 << 20), 0x10000000 + i * (4 << 20), 4 << 20) for i in range(50)]
        self.driver.digest_many(0, [(0x7F0000000000, 4 << 20)], 64 << 20)  # the kernel and scratch made first
        before = {n: self.calls(n) for n in ("cuMemcpyAsync", "cuMemcpy", "cuCtxSynchronize", "cuLaunchKernel", "cuStreamSynchronize")}
        finish = self.driver.restore_start(0, copies, 64 << 20)
        self.assertEqual(self.calls("cuStreamSynchronize"), before["cuStreamSynchronize"])  # nothing waited for yet
        self.assertEqual([len(d) for d in finish()], [1] * 50)
        after = {n: self.calls(n) - before[n] for n in before}
        self.assertEqual(after, {"cuMemcpyAsync": 50, "cuMemcpy": 0, "cuCtxSynchronize": 0, "cuLaunchKernel": 1, "cuStreamSynchronize": 1})

    def test_a_copy_that_cannot_be_queued_drains_the_stream_and_the_next_restore_works(self):
        copies = [(0x7F0000000000 + i * (4 << 20), 0x10000000 + i * (4 << 20), 4 << 20) for i in range(5)]
        self.driver.digest_many(0, [(0x7F0000000000, 4 << 20)], 64 << 20)
        syncs, launches = self.calls("cuStreamSynchronize"), self.calls("cuLaunchKernel")
        self.fake.fake_fail_after(b"cuMemcpyAsync", ctypes.c_long(2), INVALID_VALUE, ctypes.c_long(1))
        with self.assertRaisesRegex(DriverError, "cuMemcpyAsync"):
            self.driver.restore_start(0, copies, 64 << 20)
        self.assertEqual((self.calls("cuStreamSynchronize"), self.calls("cuLaunchKernel")), (syncs + 1, launches))
        self.assertEqual(len(self.driver.restore_start(0, copies, 64 << 20)()), 5)


if __name__ == "__main__":
    unittest.main()
