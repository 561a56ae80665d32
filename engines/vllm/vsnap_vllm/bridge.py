"""The bridge's state in one vLLM worker process, and the worker methods (called on every rank
through collective_rpc; the extension class in worker.py is how the worker gets them)."""

import logging
import os
import threading

from . import __version__, adapter, profile
from .drivers import default_driver
from .exportable import Exporter
from .fdsend import fetch_fds, send_fds
from .gpumem import ProcessMemory
from .regions import describe

log = logging.getLogger("vsnap_vllm")
TAG = "weights"


class BridgeError(RuntimeError):
    pass


class Bridge:
    def __init__(self):
        self._lock = threading.Lock()
        self.driver = None
        self.exporter = None
        self.hook_mode = None
        self.weights_mapped = False
        self.load_report = None
        # va -> (descriptor handed back by the SDK, its handle imported already, its device): mapped at the next wake
        self.pending = {}
        self.unsupported = None  # why the bridge stopped (a hook failed); vLLM carries on without it
        # device ordinal -> UUID, read once: while the SDK holds this process locked or
        # checkpointed (deep suspend) any CUDA call blocks, and the status must still answer.
        self._uuids = {}
        self.process_memory = ProcessMemory()

    def fail(self, where, exc):
        """A hook failed: the bridge steps aside for the rest of this process (vLLM's own paths
        run as if the plugin were absent) and says why in its status."""
        reason = f"{where}: {type(exc).__name__}: {exc}"
        if self.unsupported is None:
            self.unsupported = reason
        log.error("vsnap: the bridge is disabled in this worker (%s); vLLM carries on without it", reason, exc_info=exc)
        try:
            self._drop_pending()
        except Exception:  # noqa: BLE001 - disabled already; what is left is vLLM's
            self.pending = {}

    def _drop_pending(self):
        """Lets go of descriptors handed back and not adopted: their imported handles released, the
        descriptors closed (either would keep the SDK's memory alive)."""
        pending, self.pending = self.pending, {}
        for fd, handle, device in pending.values():
            try:
                if handle is not None:
                    self.driver.release(device, handle)
            except Exception:  # noqa: BLE001
                log.warning("vsnap: releasing a handed-back handle failed", exc_info=True)
            try:
                os.close(fd)
            except OSError:
                pass

    def _check_supported(self):
        if self.unsupported is not None:
            raise BridgeError(f"the vsnap bridge is disabled in this worker: {self.unsupported}")

    def _ensure(self):
        if self.driver is None:
            self.driver = default_driver()
            self.exporter = Exporter(self.driver)

    # ---- hooks

    def after_load(self, worker):
        """After vLLM loaded the model: make the weights exportable, and hook sleep/wake. Called
        guarded (adapter.wrap_load_model): an exception disables the bridge, never the load."""
        if self.unsupported is not None:
            return
        if adapter.allocator() is None:
            log.warning("vsnap: sleep mode is off (--enable-sleep-mode): weights stay unexportable, the bridge is idle")
            return
        if adapter.sleep_mode(worker) is False:
            log.warning("vsnap: the weights are in the cumem pool (--enable-cumem-allocator) but sleep mode is off: "
                        "start vLLM with --enable-sleep-mode to suspend it")
        with self._lock:
            self._ensure()
            # Classify first (refuses ROCm's list-shaped handles before touching any memory).
            allocations = adapter.allocations(TAG)
            self.load_report = self.exporter.make_all_exportable(allocations, copy=True)
            self.hook_mode = adapter.install_hooks(
                TAG, profile.timed("vsnap.hook on_create", self._on_create), profile.timed("vsnap.hook after_map", self._after_map),
                profile.timed("vsnap.hook before_unmap", self._before_unmap), self.fail)
            self.weights_mapped = True
            if profile.enabled():
                profile.RANK = adapter.worker_rank(worker)
                profile.instrument_allocator(adapter._cumem())  # after the hooks: its wraps are outermost
        log.info("vsnap: bridge ready (%s; weights memory %s)", self.hook_mode, self.load_report.get("kinds"))

    def _on_create(self, allocation):
        """In place of vLLM's create for one weights allocation; False: let vLLM create it."""
        if self.unsupported is not None:
            return False
        if not self._adopt_pending(allocation, in_place=False):
            self.exporter.create_on_wake(allocation)
        self.weights_mapped = True
        return True

    def _after_map(self):
        if self.unsupported is not None:
            return
        allocations = adapter.allocations(TAG)
        for allocation in allocations:
            self._adopt_pending(allocation, in_place=True)
        # Memory mapped back from the SDK counts as exportable (its descriptor is kept).
        self.exporter.make_all_exportable(allocations, copy=True)
        self.weights_mapped = True

    def _adopt_pending(self, allocation, in_place):
        """Maps back the descriptor the SDK handed over for this allocation's address, if any
        (the exporter keeps the descriptor)."""
        entry = self.pending.pop(allocation.va, None)
        if entry is None:
            return False
        fd, handle, _ = entry
        self.exporter.adopt(allocation, fd, in_place=in_place, handle=handle)
        return True

    # ---- tier 0: adopting weights the SDK kept on the GPU

    def adopt(self, worker, socket_path, nonces):
        """Fetches this rank's weights descriptors from the SDK, to be mapped back at their
        addresses by the next wake of the weights instead of new memory."""
        rank = adapter.worker_rank(worker)
        if rank >= len(nonces):
            raise BridgeError(f"no nonce for rank {rank} ({len(nonces)} given)")
        self._check_supported()
        with profile.span("vsnap adopt.fetch_fds"):
            offer, fds = fetch_fds(socket_path, nonces[rank], {"rank": rank, "pid": os.getpid()})
        regions = offer.get("regions", []) if isinstance(offer, dict) else []
        if len(regions) != len(fds):
            for fd in fds:
                os.close(fd)
            raise BridgeError(f"the SDK offered {len(fds)} descriptors for {len(regions)} regions")
        with self._lock:
            self._ensure()
            if self.weights_mapped:
                for fd in fds:
                    os.close(fd)
                raise BridgeError("the weights are awake: tier-0 adoption is for a wake from sleep")
            by_va = {a.va: a for a in adapter.allocations(TAG)}
            problems = []
            for r in regions:
                a = by_va.get(r.get("va"))
                if a is None:
                    problems.append(f"no weights allocation at {r.get('va')}")
                elif a.size != r.get("size"):
                    problems.append(f"allocation at {a.va:#x} is {a.size} bytes, the SDK's region {r.get('size')}")
            if self.driver.kind == "host":
                # a descriptor smaller than its region would fault on access: check what it holds
                for r, fd in zip(regions, fds):
                    if os.fstat(fd).st_size < (r.get("size") or 0):
                        problems.append(f"descriptor for {r.get('va')} holds {os.fstat(fd).st_size} bytes, less than {r.get('size')}")
            if problems or len(regions) != len(by_va):
                for fd in fds:
                    os.close(fd)
                raise BridgeError("tier-0 regions do not match this engine's weights: " + "; ".join(problems or [f"{len(regions)} regions for {len(by_va)} allocations"]))
            # Imported now, on a few threads, so the wake only maps them.
            devices = [by_va[r["va"]].device for r in regions]
            try:
                with profile.span("vsnap adopt.import"):
                    handles = self.exporter.import_all(fds, devices)
            except Exception:
                for fd in fds:
                    os.close(fd)
                raise
            self._drop_pending()
            self.pending = {r["va"]: (fd, h, dev) for r, fd, h, dev in zip(regions, fds, handles, devices)}
        return {"rank": rank, "regions": len(regions)}

    def _before_unmap(self):
        self.weights_mapped = False
        if self.unsupported is not None:
            return
        if self.exporter is not None:
            self.exporter.forget()

    # ---- worker methods

    def status(self, worker):
        """Plain data only: it crosses processes serialised (msgpack in vLLM)."""
        self._ensure()
        facts = adapter.engine_facts(worker)
        facts["engine"]["pluginVersion"] = __version__
        backend = adapter.attention_backend(worker)
        facts["engine"]["attentionBackend"] = backend
        device = adapter.worker_device(worker)
        try:
            allocations = adapter.allocations(TAG)
        except Exception as e:  # noqa: BLE001 - e.g. ROCm handles: say so, do not fail the status
            self.fail("status", e)
            allocations = []
        kinds = {}
        for a in allocations:
            kind = self.exporter.kinds.get(a.va)
            kinds[kind or "unknown"] = kinds.get(kind or "unknown", 0) + 1
        return {
            "supported": self.unsupported is None,
            "unsupportedReason": self.unsupported,
            "weightsMemory": kinds,
            "otherTags": sorted({a.tag for a in self._all_allocations()} - {TAG}),
            **facts,
            "rank": adapter.worker_rank(worker),
            "pid": os.getpid(),
            "device": {"ordinal": device, "uuid": self._device_uuid(device)},
            "memory": self.driver.kind,
            "sleepMode": self._sleep_mode(worker),
            "cumemAllocator": adapter.allocator() is not None,
            "asleepTags": self._asleep_tags(),
            "frontend": "rust" if adapter.rust_frontend() else "python",
            "hooks": self.hook_mode,
            "weightsMapped": self.weights_mapped,
            "regions": len(allocations),
            "bytes": sum(a.size for a in allocations),
            "attentionBackend": backend,
            **self._process_bytes(device, allocations),
            "rehome": self.load_report,
            "reloadWeights": callable(getattr(worker, "reload_weights", None)),
            "describe": True,  # vsnap_describe (and /vsnap/v1/describe): the region table while asleep
            # vsnap_digest (and /vsnap/v1/digest): the weights' GPU digests computed here
            "digest": self._can_digest(),
        }

    def _can_digest(self):
        try:
            return bool(self.driver.can_digest())
        except Exception:  # noqa: BLE001 - a reading for the status
            return False

    @staticmethod
    def _sleep_mode(worker):
        configured = adapter.sleep_mode(worker)
        return adapter.allocator() is not None if configured is None else configured and adapter.allocator() is not None

    @staticmethod
    def _asleep_tags():
        try:
            return adapter.asleep_tags()
        except Exception:  # noqa: BLE001 - a reading for the status, never a reason to fail it
            return None

    def _process_bytes(self, device, allocations):
        """processBytes: this process's GPU memory outside the weights it owns (gpumem.py), for the
        SDK's room check before a deep-suspended engine moves to another GPU."""
        if self.driver.kind != "cuda":
            return {"processBytes": None, "processBytesSource": None}
        owned = 0
        if self.weights_mapped:  # memory mapped back from the SDK (tier 0) is the SDK's in NVML's books
            owned = sum(a.size for a in allocations if not self.exporter.is_kept(a))
        try:
            return self.process_memory.read(self._device_uuid(device), owned)
        except Exception as e:  # noqa: BLE001 - a reading, never a reason to fail the status
            log.warning("vsnap: reading this process's GPU memory failed: %s", e)
            return self.process_memory.remembered()

    def _device_uuid(self, device):
        if device not in self._uuids:
            self._uuids[device] = self.driver.device_uuid(device)
        return self._uuids[device]

    def _all_allocations(self):
        try:
            return adapter.allocations()
        except Exception:  # noqa: BLE001
            return []

    def describe(self, worker):
        """This rank's weights region table, what export sends without the descriptors, awake or
        asleep: a sleeping engine keeps its allocations' addresses and sizes (vLLM frees a virtual
        range only with its segment), so the SDK can fill new memory for them before the wake and
        hand it over (adopt), instead of waiting for the wake and an export."""
        rank = adapter.worker_rank(worker)
        self._check_supported()
        with self._lock:
            self._ensure()
            allocations = self._weights_allocations()
            with profile.span("vsnap describe.describe", allocations=len(allocations)):
                regions = describe(allocations, adapter.worker_model(worker))
        return self._table(worker, rank, regions, ("key", "tag", "va", "size", "tensors", "wakeWrites"))

    def digest(self, worker, chunk_size):
        """This rank's weights region table (as describe gives it) with each region's vsnap-gd1
        digests in chunks of `chunk_size`, computed here over the memory the engine has mapped:
        the SDK's dirty check before a suspend, without an export, an import or a mapping in the
        SDK's process."""
        rank = adapter.worker_rank(worker)
        self._check_supported()
        with self._lock:
            self._ensure()
            if not self.driver.can_digest():
                raise BridgeError("this worker cannot digest its weights (host memory needs numpy): the SDK exports them instead")
            allocations = self._weights_allocations()
            if not self.weights_mapped:
                raise BridgeError("the weights are asleep: there is nothing mapped to digest")
            with profile.span("vsnap digest.describe", allocations=len(allocations)):
                regions = describe(allocations, adapter.worker_model(worker))
            device = adapter.worker_device(worker)
            with profile.span("vsnap digest.digest", allocations=len(allocations)):
                digests = self.driver.digest_many(device, [(r["va"], r["size"]) for r in regions], chunk_size)
        table = self._table(worker, rank, regions, ("key", "tag", "va", "size", "tensors", "wakeWrites"))
        for r, d in zip(table["regions"], digests):
            r["digests"] = d
        table["chunkSize"] = chunk_size
        return table

    def _weights_allocations(self):
        allocations = adapter.allocations(TAG)
        if not allocations:
            raise BridgeError("this engine has no weights allocations: was it started with --enable-sleep-mode?")
        return allocations

    def _table(self, worker, rank, regions, keys):
        """This rank's region table as the SDK reads it (an export's header, a describe's answer)."""
        device = adapter.worker_device(worker)
        # Read afresh (the worker runs here): a deep-suspended process restored onto another GPU
        # has that GPU's UUID now, and the status reports it from here on.
        self._uuids.pop(device, None)
        return {
            "version": 1,
            "rank": rank,
            "pid": os.getpid(),
            "memory": self.driver.kind,
            "device": {"ordinal": device, "uuid": self._device_uuid(device)},
            "regions": [{k: r[k] for k in keys} for r in regions],
        }

    def export(self, worker, socket_path, nonces, chunk_size=None):
        """Sends this rank's weights region table and descriptors to the SDK's socket; with
        `chunk_size`, each region's vsnap-gd1 digests too (the digest's answer, in the same call:
        a suspend that keeps the weights on the GPU needs both, and the kernel runs while the
        descriptors are made)."""
        rank = adapter.worker_rank(worker)
        if rank >= len(nonces):
            raise BridgeError(f"no nonce for rank {rank} ({len(nonces)} given)")
        self._check_supported()
        digests = None
        with self._lock:
            self._ensure()
            if chunk_size is not None and not self.driver.can_digest():
                raise BridgeError("this worker cannot digest its weights (host memory needs numpy): export without digests")
            allocations = self._weights_allocations()
            if not self.weights_mapped:
                raise BridgeError("the weights are asleep: wake them first (POST /vsnap/v1/wake with tags ['weights'])")
            with profile.span("vsnap export.make_all_exportable", allocations=len(allocations)):
                self.exporter.make_all_exportable(allocations, copy=True)
            with profile.span("vsnap export.describe"):
                regions = describe(allocations, adapter.worker_model(worker))
            for r in regions:
                r["memory"] = self.exporter.kinds.get(r["va"])
            finish = None
            if chunk_size is not None:
                with profile.span("vsnap export.digest_start", allocations=len(allocations)):
                    finish = self.driver.digest_start(adapter.worker_device(worker), [(r["va"], r["size"]) for r in regions], int(chunk_size))
            try:
                with profile.span("vsnap export.export_fds"):
                    fds = self.exporter.export_fds(allocations)
            finally:
                if finish is not None:
                    with profile.span("vsnap export.digest_finish"):
                        digests = finish()  # on a failed export too: the kernels' buffers live until they are done
        header = self._table(worker, rank, regions, ("key", "tag", "va", "size", "memory", "tensors"))
        if digests is not None:
            for r, d in zip(header["regions"], digests):
                r["digests"] = d
            header["chunkSize"] = int(chunk_size)
        try:
            with profile.span("vsnap export.send_fds", fds=len(fds)):
                send_fds(socket_path, nonces[rank], header, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return {"rank": rank, "regions": len(regions), "bytes": sum(r["size"] for r in regions)}


BRIDGE = Bridge()


def vsnap_adopt(self, socket_path, nonces):
    """Worker method: fetch the weights the SDK kept on the GPU, for the next wake."""
    with profile.span("vsnap adopt"):
        return BRIDGE.adopt(self, socket_path, list(nonces))


def vsnap_status(self):
    """Worker method: this rank's bridge status."""
    with profile.span("vsnap status"):
        return BRIDGE.status(self)


def vsnap_describe(self):
    """Worker method: this rank's weights region table, asleep or awake (no descriptors)."""
    with profile.span("vsnap describe"):
        return BRIDGE.describe(self)


def vsnap_digest(self, chunk_size):
    """Worker method: this rank's weights region table with the digests of its weights."""
    with profile.span("vsnap digest"):
        return BRIDGE.digest(self, int(chunk_size))


def vsnap_export(self, socket_path, nonces, chunk_size=None):
    """Worker method: send this rank's weights regions to the SDK (with their digests, given a chunk size)."""
    with profile.span("vsnap export"):
        return BRIDGE.export(self, socket_path, list(nonces), chunk_size)

