"""The `vsnap` sleep-mode backend for vLLM (`--sleep-mode-backend vsnap`): vLLM's own /sleep,
/wake_up, `LLM.sleep()` / `wake_up()` and the engine's RPCs sleep and wake through it. Registered
by the plugin's general-plugin entry point with SleepModeBackendFactory.register_backend where
vLLM has the factory (vllm/device_allocator/sleep_mode_backend.py, PR #44074).

What each level does (the KV cache, and every tag other than the weights, as vLLM's cumem backend:
released at sleep, new memory at wake):
- suspend(1): the weights regions are digested (vsnap-gd1, on the GPU) and written into the shared
  RAM tier (ram_tier.py) unless it holds those bytes already (then nothing is copied), then
  released; the tier holds them for this engine until its wake, and the worker keeps their files
  mapped and page-locked until then, so the copies both ways run from pinned memory.
- suspend(2): released only if the RAM tier holds every weights region's current bytes (their
  digests match); otherwise refused with an error, nothing released.
- resume(tags): vLLM's allocator maps new memory at the same addresses; the weights are copied
  back from the tier and digested (on CUDA: every copy and the digest, one launch, queued on one
  stream and waited for once); a mismatch or a failure leaves the weights asleep (released
  again) and raises, so the engine stays asleep and a retry of the wake can succeed.
- Without a RAM tier (VSNAP_RAM_TIER unset or not made: settings.ram_tier_dir), sleep and wake are
  vLLM's CuMemBackend itself, said in one log line. A tier too full (or a tmpfs without room) for
  a level-1 sleep hands that sleep to CuMemBackend (logged); a level-2 sleep is then refused with
  the reason."""

import logging
import os
import threading
import time
import uuid

from . import settings
from .drivers import default_driver
from .ram_tier import RamTier, TierFull, TierUnavailable, region_key

try:
    from vllm.device_allocator.sleep_mode_backend import CuMemBackend, SleepModeBackend
except ImportError:  # vLLM without pluggable sleep-mode backends: this module is never selected
    CuMemBackend = SleepModeBackend = object

log = logging.getLogger("vsnap_vllm")
WEIGHTS = "weights"
CHUNK = 64 << 20  # the digest's chunk (the SDK's default checksum granularity)


class SleepRefused(RuntimeError):
    """A level-2 sleep that would discard weights nothing can bring back."""


class WakeFailed(RuntimeError):
    """The weights could not be restored: they are asleep again; the message says what to do."""


def _allocator():
    from vllm.device_allocator import get_mem_allocator_instance

    return get_mem_allocator_instance()


class VsnapSleepBackend(SleepModeBackend):
    def __init__(self):
        super().__init__()
        self._state = "RUNNING"
        self._owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._held = None  # [(va, size, key, device)] of the weights the tier holds for this sleep
        self._maps = {}  # key -> (address, size, device, page-locked): the held entries, mapped from sleep to wake
        self._driver = None
        self._letting_go = None  # the thread that lets the last wake's page-locked entries go, joined by the next sleep
        self._asleep = set()  # the tags put to sleep and not woken since: state() is SUSPENDED while any is
        self._cumem = CuMemBackend()  # without the tier (or with it too full): vLLM's own backend, as it is
        try:
            self._tier = RamTier.open(settings.ram_tier_dir())
        except TierUnavailable as e:
            self._tier = None
            log.warning("vsnap sleep-mode backend: %s: sleeping as vLLM's cumem backend", e)

    @classmethod
    def preserves_communicators(cls):
        return True  # memory only, as cumem: communicators are outside the allocator's pool

    # ---- the weights

    def _weights(self, allocator):
        datas = [(va, d) for va, d in allocator.pointer_to_data.items() if d.tag == WEIGHTS and not getattr(d, "is_asleep", False)]
        return [(va, d.handle[1], d.handle[0]) for va, d in sorted(datas, key=lambda x: x[0])]

    def _digests(self, regions):
        """Each region's tier key, the regions of a device digested in one call."""
        if self._driver is None:
            self._driver = default_driver()
        keys = [None] * len(regions)
        for device in {d for _, _, d in regions}:
            mine = [i for i, (_, _, d) in enumerate(regions) if d == device]
            chunks = self._driver.digest_many(device, [(regions[i][0], regions[i][1]) for i in mine], CHUNK)
            for i, c in zip(mine, chunks):
                keys[i] = region_key(c, regions[i][1])
        return keys

    def _restore(self, copies):
        """Copies each (va, tier address, size, device) back into the weights and returns each
        region's tier key, digested from what landed: a device's copies and its digest (one launch
        behind them on one stream) queued together and waited for once, every device's before the
        first wait."""
        keys, pending = [None] * len(copies), []
        try:
            for device in sorted({c[3] for c in copies}):
                mine = [i for i, c in enumerate(copies) if c[3] == device]
                pending.append((mine, self._driver.restore_start(device, [copies[i][:3] for i in mine], CHUNK)))
        finally:
            for mine, finish in pending:  # waited for on a failure too: the next digest reuses the scratch memory
                for i, chunks in zip(mine, finish()):
                    keys[i] = region_key(chunks, copies[i][2])
        return keys

    def _map(self, key, size, device, address):
        """Keeps entry `key` mapped (and page-locked where the driver can) until the wake, so the
        copies to and from it run at the link's rate, not through pageable memory."""
        self._maps[key] = (address, size, device, self._driver.host_register(device, address, size))

    def _unmap_all(self):
        maps, self._maps = self._maps, {}
        self._let_go(maps)

    def _let_go(self, maps):
        for address, size, device, locked in maps.values():
            if locked:
                self._driver.host_unregister(device, address)
            RamTier.unmap(address, size)

    def _let_go_after_wake(self):
        """Unmaps this sleep's entries and ends its hold. Page-locked entries are let go on a
        thread of their own, after the wake returned (unpinning and unmapping take time for every
        page, not measured on a GPU yet: the INFO line says; the next sleep waits for it first);
        the hold ends after the unmapping, so the tier's budget holds throughout."""
        maps, self._maps = self._maps, {}

        def let_go():
            t0 = time.perf_counter()
            try:
                self._let_go(maps)
            finally:
                self._tier.release(self._owner)
            return time.perf_counter() - t0

        if not any(m[3] for m in maps.values()):
            return let_go()

        def run():
            try:
                log.info("vsnap: the last wake's %d tier entries let go in %.3f s, after the wake", len(maps), let_go())
            except Exception:  # noqa: BLE001 - logged; the hold ends with this process at the latest
                log.exception("vsnap: letting the last wake's tier entries go failed")

        self._letting_go = threading.Thread(target=run, name="vsnap-let-go", daemon=True)
        self._letting_go.start()
        return None

    def _settle(self):
        """Waits for the last wake's entries to be let go (before a sleep maps and holds again)."""
        thread, self._letting_go = self._letting_go, None
        if thread is not None:
            thread.join()

    def _take(self, regions, keys, copy=True):
        """The weights' entries held for this engine and mapped; with `copy`, the regions the tier
        lacks copied into it (the rest only touched). Returns the keys the tier lacked."""
        missing = self._tier.admit(self._owner, dict(zip(keys, (s for _, s, _ in regions))))
        if missing and not copy:
            self._tier.release(self._owner)
            return missing
        written = set()
        try:
            for (va, size, device), key in zip(regions, keys):
                if key in self._maps:
                    continue
                if key in missing:
                    tmp, address = self._tier.create(key, size)
                    try:
                        self._map(key, size, device, address)
                        self._driver.copy_host(device, address, va, size)
                        self._tier.commit(tmp, key)
                    except BaseException:
                        entry = self._maps.pop(key, None)
                        if entry and entry[3]:
                            self._driver.host_unregister(device, address)
                        self._tier.abandon(tmp, address, size)
                        raise
                    written.add(key)
                else:
                    self._map(key, size, device, self._tier.map(key, size))
                    self._tier.touch(key)
        except BaseException:
            self._unmap_all()
            self._tier.release(self._owner)
            raise
        log.info("vsnap: %d weights regions in the RAM tier (%d copied, %d held already)", len(regions), len(written), len(regions) - len(written))
        return {}

    def suspend(self, level=1):
        self._suspend(level)
        # every allocation sleeps at either level (the level only decides what is kept): vLLM's
        # own allocator says nothing of which tags are asleep, so the backend keeps count itself
        self._asleep = {d.tag for d in _allocator().pointer_to_data.values()}
        self._state = "SUSPENDED"

    def _suspend(self, level):
        self._settle()
        if self._tier is None:
            self._cumem.suspend(level)
            return
        allocator = _allocator()
        t0 = time.perf_counter()
        regions = self._weights(allocator)
        keys = self._digests(regions)
        t1 = time.perf_counter()
        if level == 2:
            # held first, then checked: an entry another engine evicts meanwhile counts as lacking
            try:
                lacking = self._take(regions, keys, copy=False)
            except TierFull as e:
                lacking, reason = keys, f"{e} (a larger tier budget, or a level-1 sleep, which keeps vLLM's own host copy then)"
            except OSError as e:
                lacking, reason = keys, f"the RAM tier at {self._tier.path} could not be mapped ({e})"
            else:
                reason = (f"the RAM tier at {self._tier.path} does not hold {len(lacking)} of {len(keys)} weights regions as they are now "
                          "(sleep at level 1 first, which puts them there)")
            if lacking:
                raise SleepRefused(f"vsnap: level-2 sleep refused, nothing released: {reason}")
        else:
            try:
                self._take(regions, keys)
            except (TierFull, OSError) as e:
                log.warning("vsnap: %s: this level-1 sleep keeps vLLM's own host copy of the weights", e)
                self._held = None
                self._cumem.suspend(1)
                return
        self._held = [(va, size, key, device) for (va, size, device), key in zip(regions, keys)]
        t2 = time.perf_counter()
        allocator.sleep(offload_tags=())
        log.info("vsnap: level-%d sleep of %d weights regions (%.2f GiB): digested in %.3f s, in the tier (copied where it lacked them) "
                 "and page-locked in %.3f s, memory released in %.3f s", level, len(regions), sum(r[1] for r in regions) / 2**30,
                 t1 - t0, t2 - t1, time.perf_counter() - t2)

    def resume(self, tags=None):
        allocator = _allocator()
        self._state = "RESUMING"
        woke = False
        try:
            if self._held is None:
                self._cumem.resume(tags)
            else:
                t0 = time.perf_counter()
                allocator.wake_up(tags)
                if tags is None or WEIGHTS in tags:
                    self._hydrate(allocator, tags, time.perf_counter() - t0)
            woke = True
        finally:
            if woke:
                self._asleep = set() if tags is None else self._asleep - set(tags)
            self._state = "SUSPENDED" if self._asleep else "RUNNING"

    def _hydrate(self, allocator, tags, mapped_s):
        t0 = time.perf_counter()
        try:
            got = self._restore([(va, self._maps[key][0], size, device) for va, size, key, device in self._held])
            bad = [hex(va) for (va, _, key, _), k in zip(self._held, got) if k != key]
            if bad:
                raise RuntimeError(f"{len(bad)} restored weights regions do not match what was put to sleep ({', '.join(bad[:4])})")
        except Exception as e:
            _release(allocator, tags)  # what this wake mapped asleep again: no half-restored model serves
            raise WakeFailed(f"vsnap: the weights could not be restored from the RAM tier at {self._tier.path} ({type(e).__name__}: {e}); "
                             "the engine stays asleep: retry the wake, or wake the weights and call reload_weights") from e
        held, self._held = self._held, None
        t1 = time.perf_counter()
        let_go = self._let_go_after_wake()
        log.info("vsnap: wake of %d weights regions (%.2f GiB): memory mapped in %.3f s, copied back and digested in %.3f s, "
                 "the tier's entries %s", len(held), sum(h[1] for h in held) / 2**30, mapped_s, t1 - t0,
                 "being let go after the wake" if let_go is None else f"let go in {let_go:.3f} s")

    def discard(self, tags):
        _allocator().discard(tags)
        if WEIGHTS in tags and self._held is not None:
            self._held = None
            self._unmap_all()
            self._tier.release(self._owner)
        self._asleep |= set(tags)
        self._state = "SUSPENDED"


def _release(allocator, tags):
    """Puts what a failed wake mapped (the allocations of `tags`; None: of every tag) back to sleep
    without a copy: the allocator's discard(tags), or, on an allocator without one (vLLM main's
    cumem.py at e5337d96, whose sleep() would unmap the allocations asleep already too, and whose
    AllocationData has no is_asleep), each of them unmapped with vLLM's module-level
    unmap_and_release (the one the plugin's hooks wrap). The executor counts them asleep still:
    its wake failed."""
    wanted = {d.tag for d in allocator.pointer_to_data.values()} if tags is None else set(tags)
    if hasattr(allocator, "discard"):
        allocator.discard(tuple(sorted(wanted)))
        return
    from .adapter import _cumem

    cumem = _cumem()
    for data in allocator.pointer_to_data.values():
        if data.tag in wanted and not getattr(data, "is_asleep", False):
            cumem.unmap_and_release(data.handle)
            if hasattr(data, "is_asleep"):
                data.is_asleep = True
