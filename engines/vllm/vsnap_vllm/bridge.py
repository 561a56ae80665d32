"""The bridge's state in one vLLM worker process, and the methods it adds to vLLM's Worker
(called on every rank through collective_rpc)."""

import logging
import os
import threading
import time

from . import __version__, adapter
from .drivers import default_driver
from .exportable import Exporter
from .fdsend import send_fds
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
        self.last_wake = None

    def _ensure(self):
        if self.driver is None:
            self.driver = default_driver()
            self.exporter = Exporter(self.driver)

    # ---- hooks

    def after_load(self, worker):
        """After vLLM loaded the model: rehome the weights, and hook sleep/wake."""
        if adapter.allocator() is None:
            log.warning("vsnap: sleep mode is off (--enable-sleep-mode): weights stay unexportable, the bridge is idle")
            return
        with self._lock:
            self._ensure()
            self.load_report = self.exporter.make_all_exportable(adapter.allocations(TAG), copy=True)
            self.hook_mode = adapter.install_hooks(TAG, self._on_create, self._after_map, self._before_unmap)
            self.weights_mapped = True
        log.info("vsnap: bridge ready (%s)", self.hook_mode)

    def _on_create(self, allocation):
        self.exporter.create_on_wake(allocation)
        self.weights_mapped = True
        self.last_wake = time.time()

    def _after_map(self):
        self.exporter.make_all_exportable(adapter.allocations(TAG), copy=True)
        self.weights_mapped = True
        self.last_wake = time.time()

    def _before_unmap(self):
        self.weights_mapped = False

    # ---- worker methods

    def status(self, worker):
        self._ensure()
        allocations = adapter.allocations(TAG)
        device = adapter.worker_device(worker)
        facts = adapter.engine_facts(worker)
        facts["engine"]["pluginVersion"] = __version__
        facts["engine"]["attentionBackend"] = adapter.attention_backend(worker)
        return {
            **facts,
            "rank": adapter.worker_rank(worker),
            "pid": os.getpid(),
            "device": {"ordinal": device, "uuid": self.driver.device_uuid(device)},
            "memory": self.driver.kind,
            "sleepMode": adapter.allocator() is not None,
            "hooks": self.hook_mode,
            "weightsMapped": self.weights_mapped,
            "regions": len(allocations),
            "bytes": sum(a.size for a in allocations),
            "attentionBackend": adapter.attention_backend(worker),
            "rehome": self.load_report,
        }

    def export(self, worker, socket_path, nonces):
        """Sends this rank's weights region table and descriptors to the SDK's socket."""
        rank = adapter.worker_rank(worker)
        if rank >= len(nonces):
            raise BridgeError(f"no nonce for rank {rank} ({len(nonces)} given)")
        with self._lock:
            self._ensure()
            allocations = adapter.allocations(TAG)
            if not allocations:
                raise BridgeError("this engine has no weights allocations: was it started with --enable-sleep-mode?")
            if not self.weights_mapped:
                raise BridgeError("the weights are asleep: wake them first (POST /vsnap/v1/wake with tags ['weights'])")
            self.exporter.make_all_exportable(allocations, copy=True)
            regions = describe(allocations, adapter.worker_model(worker))
            fds = self.exporter.export_fds(allocations)
        device = adapter.worker_device(worker)
        header = {
            "version": 1,
            "rank": rank,
            "pid": os.getpid(),
            "memory": self.driver.kind,
            "device": {"ordinal": device, "uuid": self.driver.device_uuid(device)},
            "regions": [{k: r[k] for k in ("key", "tag", "va", "size", "tensors")} for r in regions],
        }
        try:
            send_fds(socket_path, nonces[rank], header, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return {"rank": rank, "regions": len(regions), "bytes": sum(r["size"] for r in regions)}


BRIDGE = Bridge()


def vsnap_status(self):
    """Worker method: this rank's bridge status."""
    return BRIDGE.status(self)


def vsnap_export(self, socket_path, nonces):
    """Worker method: send this rank's weights regions to the SDK."""
    return BRIDGE.export(self, socket_path, list(nonces))


WORKER_METHODS = {"vsnap_status": vsnap_status, "vsnap_export": vsnap_export}
