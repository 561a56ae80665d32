"""Making weights memory exportable as POSIX descriptors, in place, at the same addresses.

Each weights allocation is classified after the model is loaded (drivers.POSIX_FD / NONE /
FABRIC): vLLM since PR #33540 creates POSIX-FD exportable memory on GPUs without IMEX (exported
as it is: no rehome, no copy); older vLLM creates it without an export handle type, and IMEX
systems (GB200 NVL) get FABRIC-only memory: the driver refuses a POSIX export of both. Such an
allocation is "rehomed": exportable memory
of the same size is created, the bytes are copied into it device-to-device, vLLM's memory is
unmapped and released, the new memory is mapped at the original address, and vLLM's handle
slot is pointed at it, so vLLM's own release frees it later. On every wake, memory of the
weights tag is created exportable from the start (it is empty: nothing to copy).
"""

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from .drivers import NONE, POSIX_FD, NotExportable

log = logging.getLogger("vsnap_vllm")

# Descriptors handed back by the SDK are imported this many at once before the wake maps them: an
# import costs about 0.1 ms a region in the driver, and vLLM's wake maps one allocation after another.
IMPORT_THREADS = 8
# Below this many, one thread imports them (starting threads would cost more).
IMPORT_PARALLEL_FROM = 16


class Exporter:
    def __init__(self, driver):
        self.driver = driver
        self._known = set()  # (device, handle) pairs known to be exportable
        # (device, handle) -> the descriptor memory mapped back from the SDK came in. An imported
        # handle cannot be exported again, so its exports are copies of that descriptor: no rehome.
        self._kept = {}
        self.kinds = {}  # va -> what the memory was at load (drivers.POSIX_FD / NONE / FABRIC)

    def is_exportable(self, allocation):
        key = (allocation.device, allocation.handle)
        if key in self._known or key in self._kept:
            return True
        try:
            fd = self.driver.export_fd(allocation.device, allocation.handle)
        except NotExportable:
            return False
        os.close(fd)
        self._known.add(key)
        return True

    def rehome(self, allocation, copy=True):
        """Puts exportable memory under `allocation`'s address, keeping its bytes if `copy`."""
        d, dev, size, va = self.driver, allocation.device, allocation.size, allocation.va
        new = d.create_exportable(dev, size)
        try:
            if copy:
                staging = d.reserve(dev, size)
                try:
                    d.map(dev, staging, size, new)
                    try:
                        d.copy(dev, staging, va, size)
                    finally:
                        d.unmap(dev, staging, size)
                finally:
                    d.free_address(dev, staging, size)
            old = allocation.handle
            d.unmap(dev, va, size)
            try:
                d.map(dev, va, size, new)
            except Exception:
                d.map(dev, va, size, old)  # put vLLM's memory back before failing
                raise
        except Exception:
            d.release(dev, new)
            raise
        d.release(dev, old)
        self._known.discard((dev, old))
        allocation.set_handle(new)
        self._known.add((dev, new))

    def create_on_wake(self, allocation):
        """In place of vLLM's create_and_map for one allocation: exportable memory, mapped."""
        new = self.driver.create_mapped(allocation.device, allocation.va, allocation.size)
        allocation.set_handle(new)
        self._known.add((allocation.device, new))

    def import_all(self, fds, devices):
        """Imports descriptors handed back (`devices[i]`: the GPU of `fds[i]`'s allocation), on a few
        threads when there are many (ctypes lets go of the GIL in the driver's calls), so the wake
        that adopts them only maps. Returns the handles in order. On a failure, every handle made is
        released again and the error raised; the descriptors stay the caller's (open) either way."""
        d = self.driver
        results = [None] * len(fds)
        failure = []  # list.append is atomic: the threads need no lock for it

        def one(i):
            if failure:
                return
            try:
                results[i] = d.import_fd(fds[i])
            except Exception as e:  # noqa: BLE001 - raised below, once every import stopped
                failure.append(e)

        if len(fds) < IMPORT_PARALLEL_FROM:
            for i in range(len(fds)):
                one(i)
        else:
            with ThreadPoolExecutor(max_workers=IMPORT_THREADS, thread_name_prefix="vsnap-import") as pool:
                list(pool.map(one, range(len(fds))))
        if failure:
            for dev, h in zip(devices, results):
                if h is not None:
                    _release_quietly(d, dev, h)
            raise failure[0]
        return results

    def adopt(self, allocation, fd, in_place=False, handle=None):
        """Maps memory someone handed back (tier 0: the weights this allocation had before it slept,
        kept alive by the SDK) at the allocation's address, instead of new memory. `in_place`:
        vLLM already mapped fresh memory there (official hooks), which is replaced. No copy.
        `handle`: `fd` imported already (import_all), else it is imported here.
        Takes `fd` (and `handle`): kept for exports until forget(), closed if the adoption fails."""
        d, dev, size, va = self.driver, allocation.device, allocation.size, allocation.va
        if handle is None:
            try:
                handle = d.import_fd(fd)
            except Exception:
                os.close(fd)
                raise
        try:
            if in_place:
                old = allocation.handle
                d.unmap(dev, va, size)
                try:
                    d.map(dev, va, size, handle)
                except Exception:
                    d.map(dev, va, size, old)
                    raise
                d.release(dev, old)
                self._known.discard((dev, old))
            else:
                d.map(dev, va, size, handle)
        except Exception:
            d.release(dev, handle)
            os.close(fd)
            raise
        allocation.set_handle(handle)
        self._known.discard((dev, handle))
        self._kept[(dev, handle)] = fd

    def is_kept(self, allocation):
        """True when the allocation's memory was mapped back from a descriptor (tier 0)."""
        return (allocation.device, allocation.handle) in self._kept

    def forget(self):
        """The weights are about to be released (sleep): drop what is known of their handles (the
        driver may reuse the values) and close the kept descriptors, which would keep the memory."""
        self._known.clear()
        for fd in self._kept.values():
            os.close(fd)
        self._kept.clear()

    def kind_of(self, allocation):
        """What the allocation's memory is now: POSIX_FD when it exports, else NONE or FABRIC."""
        if self.is_exportable(allocation):
            return POSIX_FD
        kind_fn = getattr(self.driver, "handle_kind", None)
        kind = kind_fn(allocation.device, allocation.handle) if kind_fn else NONE
        return NONE if kind == POSIX_FD else kind  # claims POSIX-FD but did not export: treat as none

    def _all_known(self, allocations):
        """True when every allocation's memory is known exportable (made so, or mapped back from
        a kept descriptor) and its kind at load recorded: what make_all_exportable would find."""
        known, kept, kinds = self._known, self._kept, self.kinds
        for a in allocations:
            key = (a.device, a.handle)
            if (key not in known and key not in kept) or a.va not in kinds:
                return False
        return True

    def make_all_exportable(self, allocations, copy=True):
        """Rehomes every allocation that is not exportable yet; returns what it did, per kind of
        memory: {"kinds": {kind: count}, "seconds": {kind: s}, "rehomed", "alreadyExportable", "bytes"}."""
        started = time.perf_counter()
        if self._all_known(allocations):  # every export after a wake: nothing to classify, nothing to rehome
            seconds = time.perf_counter() - started
            n = len(allocations)
            return {"rehomed": 0, "alreadyExportable": n, "bytes": 0, "seconds": seconds,
                    "kinds": {POSIX_FD: n} if n else {}, "secondsByKind": {POSIX_FD: seconds} if n else {}}
        rehomed = kept = moved = 0
        counts, seconds_by = {}, {}
        for allocation in allocations:
            t0 = time.perf_counter()
            kind = self.kind_of(allocation)
            if kind == POSIX_FD:
                kept += 1
            else:
                self.rehome(allocation, copy=copy)
                rehomed += 1
                moved += allocation.size
            self.kinds.setdefault(allocation.va, kind)
            counts[kind] = counts.get(kind, 0) + 1
            seconds_by[kind] = seconds_by.get(kind, 0.0) + time.perf_counter() - t0
        seconds = time.perf_counter() - started
        if rehomed:
            log.info("vsnap: made %d weights allocation(s) exportable (%.2f GiB) in %.1f ms; %d already were",
                     rehomed, moved / 2**30, seconds * 1000, kept)
        return {"rehomed": rehomed, "alreadyExportable": kept, "bytes": moved, "seconds": seconds,
                "kinds": counts, "secondsByKind": seconds_by}

    def export_fds(self, allocations):
        """A new descriptor for each allocation (the caller closes them): one driver batch for
        the allocations of one device that were not mapped back from a kept descriptor."""
        fds = [None] * len(allocations)
        exported = []  # indices into allocations, in the order of the driver's batch
        try:
            for i, allocation in enumerate(allocations):
                kept = self._kept.get((allocation.device, allocation.handle))
                if kept is not None:
                    fds[i] = os.dup(kept)
                else:
                    exported.append(i)
            if exported:
                devices = {allocations[i].device for i in exported}
                if len(devices) == 1:
                    try:
                        got = self.driver.export_fds(devices.pop(), [allocations[i].handle for i in exported])
                    except NotExportable as e:
                        raise self._not_exportable(allocations[exported[getattr(e, "index", 0)]], e) from e
                else:
                    got = []
                    try:
                        for i in exported:
                            got.append(self.driver.export_fd(allocations[i].device, allocations[i].handle))
                    except NotExportable as e:
                        for fd in got:
                            os.close(fd)
                        raise self._not_exportable(allocations[exported[len(got)]], e) from e
                    except Exception:
                        for fd in got:
                            os.close(fd)
                        raise
                for i, fd in zip(exported, got):
                    fds[i] = fd
        except Exception:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            raise
        return fds

    @staticmethod
    def _not_exportable(allocation, cause):
        return NotExportable(
            f"weights allocation at {allocation.va:#x} is not exportable: was the engine started with the vsnap "
            "plugin loaded (VLLM_PLUGINS includes vsnap) and --enable-sleep-mode?")


def _release_quietly(driver, device, handle):
    """Releases a handle on a path that is failing already (its own error would hide the first)."""
    try:
        driver.release(device, handle)
    except Exception:  # noqa: BLE001
        log.warning("vsnap: releasing an imported handle failed", exc_info=True)
