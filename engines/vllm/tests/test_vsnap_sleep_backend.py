"""The `vsnap` sleep-mode backend in a real Worker of the reference engine (host memory,
in-process): selected with sleep_mode_backend="vsnap" and made by vLLM's factory; level-1 and
level-2 cycles, waking by tags; the RL loop (the weights changed between sleeps come back, never
the bytes of an earlier sleep); no RAM tier (cumem's behaviour, one log line); a wake that fails
half way (the engine left asleep, a retry works, nothing leaked); a tier too full; an entry
changed behind the backend's back."""

import glob
import logging
import os
import shutil
import tempfile
import threading
import types
import unittest

from tests import support
import vsnap_vllm
from vsnap_vllm import drivers
from vllm.device_allocator import cumem
from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
from vllm.v1.worker.gpu_worker import Worker
from vsnap_vllm.ram_tier import RamTier
from vsnap_vllm.sleep_backend import SleepRefused, VsnapSleepBackend, WakeFailed

vsnap_vllm.register_sleep_backend(logging.getLogger("vsnap_vllm"))
PROMPT = [1, 2, 3]


def config(**kw):
    base = dict(model="m", revision="r", dtype="bfloat16", seed=3, layers=2, enable_sleep_mode=True,
                keeps_workspace=False, sleep_mode_offload_cudagraph=False, sleep_mode_backend="vsnap")
    base.update(kw)
    return types.SimpleNamespace(**base)


def weights_bytes(worker):
    return sum(d.handle[1] for d in cumem.CuMemAllocator.get_instance().pointer_to_data.values() if d.tag == "weights")


class BackendTest(unittest.TestCase):
    budget = 1 << 30

    def setUp(self):
        cumem.CuMemAllocator.instance = None
        self.dir = tempfile.mkdtemp(prefix="vsnap-ram-")
        self.tier = RamTier.init(self.dir, self.budget)
        self.saved = {"VSNAP_RAM_TIER": os.environ.get("VSNAP_RAM_TIER")}
        os.environ["VSNAP_RAM_TIER"] = self.dir

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        support.free_allocator()
        shutil.rmtree(self.dir, ignore_errors=True)

    def load(self, **kw):
        worker = Worker(config(**kw))
        worker.load_model()
        worker.initialize_cache()
        return worker

    def answer(self, worker):
        return worker.generate(PROMPT, 4)[0]

    def wake(self, worker):
        worker.wake_up(["weights"])
        worker.wake_up(["kv_cache"])

    def asleep(self):
        return {d.tag for d in cumem.CuMemAllocator.get_instance().pointer_to_data.values() if d.is_asleep}

    def holds(self):
        return os.listdir(os.path.join(self.dir, "holds"))


class LevelsTest(BackendTest):
    def test_the_flag_selects_the_vsnap_backend(self):
        worker = self.load()
        self.assertIsInstance(worker._get_sleep_mode_backend(), VsnapSleepBackend)
        self.assertFalse(VsnapSleepBackend.supports_durable_storage())
        self.assertTrue(VsnapSleepBackend.preserves_communicators())

    def test_level_1_puts_the_weights_in_the_tier_once_and_wakes_them_by_tags(self):
        worker = self.load()
        expected = self.answer(worker)
        worker.sleep(1)
        self.assertEqual(self.asleep(), {"weights", "kv_cache"})
        self.assertEqual(self.tier.used_bytes(), weights_bytes(worker))
        self.assertTrue(all(d.cpu_backup_tensor is None for d in cumem.CuMemAllocator.get_instance().pointer_to_data.values()))
        self.assertEqual(worker._sleep_mode_backend.state(), "SUSPENDED")
        worker.wake_up(["weights"])
        self.assertEqual(self.asleep(), {"kv_cache"})
        self.assertEqual(worker._sleep_mode_backend.state(), "SUSPENDED")
        worker.wake_up(["weights"])  # awake already: the KV cache stays released
        self.assertEqual(worker._sleep_mode_backend.state(), "SUSPENDED")
        worker.wake_up(["kv_cache"])
        self.assertEqual(worker._sleep_mode_backend.state(), "RUNNING")
        self.assertEqual(self.answer(worker), expected)
        self.assertEqual(self.holds(), [])
        # the same bytes again: nothing copied, the entries only touched
        before = {k: os.stat(os.path.join(self.dir, "entries", k)).st_ino for k in self.tier.entries()}
        worker.sleep(1)
        self.assertEqual({k: os.stat(os.path.join(self.dir, "entries", k)).st_ino for k in self.tier.entries()}, before)
        self.wake(worker)
        self.assertEqual(self.answer(worker), expected)

    def test_level_2_is_refused_until_the_tier_holds_the_weights_and_then_needs_no_reload(self):
        worker = self.load()
        expected = self.answer(worker)
        with self.assertRaisesRegex(SleepRefused, "level-2 sleep refused, nothing released"):
            worker.sleep(2)
        self.assertEqual(self.asleep(), set())
        self.assertEqual(self.answer(worker), expected)
        worker.sleep(1)
        self.wake(worker)
        worker.sleep(2)
        self.assertEqual(self.asleep(), {"weights", "kv_cache"})
        self.wake(worker)
        self.assertEqual(self.answer(worker), expected)
        self.assertEqual(worker.ref_weight_loads(), 1)  # no reload_weights: the tier brought them back

    def test_a_wake_of_every_tag_at_once(self):
        worker = self.load()
        expected = self.answer(worker)
        worker.sleep(1)
        worker.wake_up(None)
        self.assertEqual(self.asleep(), set())
        self.assertEqual(self.answer(worker), expected)


class DiscardTest(BackendTest):
    def test_discard_releases_the_kv_cache_as_cumem_and_a_discarded_sleep_drops_its_hold(self):
        worker = self.load()
        expected = self.answer(worker)
        worker.discard(["kv_cache"])  # the KV-cache release (EngineCore.release_kv_cache_memory)
        self.assertEqual(self.asleep(), {"kv_cache"})
        self.assertEqual(worker._sleep_mode_backend.state(), "SUSPENDED")
        worker.wake_up(["weights"])  # awake already: the KV cache stays released
        self.assertEqual(worker._sleep_mode_backend.state(), "SUSPENDED")
        worker.wake_up(["kv_cache"])
        self.assertEqual(worker._sleep_mode_backend.state(), "RUNNING")
        self.assertEqual(self.answer(worker), expected)
        worker.sleep(1)
        self.assertEqual(len(self.holds()), 1)
        worker.discard(["weights"])  # content not kept: the hold on the tier ends
        self.assertEqual(self.holds(), [])
        worker.wake_up(["weights"])  # fresh memory, as cumem's after a discard
        worker.reload_weights()
        worker.wake_up(["kv_cache"])
        self.assertEqual(self.answer(worker), expected)


class RlLoopTest(BackendTest):
    def test_weights_updated_between_sleeps_come_back_never_the_stale_ones(self):
        worker = self.load()
        original = self.answer(worker)
        worker.sleep(1)
        self.wake(worker)
        worker.init_weight_transfer_engine({"backend": "reference"})
        fresh = self.load_other(seed=11)
        self.assertNotEqual(fresh, original)
        for step in range(2):
            worker.start_weight_update()
            worker.update_weights({"seed": 11 if step == 0 else 3, "layers": None})
            worker.finish_weight_update()
            updated = self.answer(worker)
            worker.sleep(1)
            self.wake(worker)
            self.assertEqual(self.answer(worker), updated)
            if step == 0:
                self.assertEqual(updated, fresh)

    def load_other(self, seed):
        """The answer of a model loaded from `seed` (host model: the answer depends on every byte)."""
        from host_model import HostModel

        probe = HostModel(config(seed=seed), 0)
        saved, cumem.CuMemAllocator.instance = cumem.CuMemAllocator.instance, None
        try:
            probe.load()
            kv = probe.allocate_kv_cache()
            return probe.generate(PROMPT, 4, kv)[0]
        finally:
            support.free_allocator()
            cumem.CuMemAllocator.instance = saved


class NoTierTest(BackendTest):
    def test_without_a_tier_it_sleeps_as_cumem_and_says_so_once(self):
        os.environ.pop("VSNAP_RAM_TIER")
        worker = self.load()
        expected = self.answer(worker)
        with self.assertLogs("vsnap_vllm", level="WARNING") as logs:
            worker.sleep(1)
        self.assertEqual(len(logs.records), 1)
        self.assertIn("sleeping as vLLM's cumem backend", logs.output[0])
        self.assertTrue(any(d.cpu_backup_tensor is not None for d in cumem.CuMemAllocator.get_instance().pointer_to_data.values()))
        self.wake(worker)
        self.assertEqual(self.answer(worker), expected)
        worker.sleep(2)  # cumem's level 2: the weights discarded, reload_weights brings them back
        worker.wake_up(["weights"])
        worker.reload_weights()
        worker.wake_up(["kv_cache"])
        self.assertEqual(self.answer(worker), expected)


class FailingCopyBack(drivers.HostDriver):
    """The host driver, its copy after the first `after` failing once: put in place of the
    backend's driver after a sleep, a wake that fails with `after` regions copied back."""

    def __init__(self, after):
        self.after, self.copied, self.failed = after, 0, False

    def copy_host(self, device, dst, src, size):
        if not self.failed and self.copied == self.after:
            self.failed = True
            raise RuntimeError(f"copy failed after {self.after} regions")
        self.copied += 1
        super().copy_host(device, dst, src, size)


class FailureTest(BackendTest):
    def fail_next_wake_after(self, worker, regions):
        worker._get_sleep_mode_backend()._driver = driver = FailingCopyBack(regions)
        return driver

    def test_a_wake_failing_half_way_leaves_the_engine_asleep_and_a_retry_works(self):
        worker = self.load()
        expected = self.answer(worker)
        worker.sleep(1)
        driver = self.fail_next_wake_after(worker, 1)
        with self.assertRaisesRegex(WakeFailed, "the engine stays asleep: retry the wake"):
            worker.wake_up(["weights"])
        self.assertTrue(driver.failed)
        self.assertEqual(self.asleep(), {"weights", "kv_cache"})
        self.assertEqual(len(self.holds()), 1)  # still held: the retry needs them
        self.wake(worker)
        self.assertEqual(self.answer(worker), expected)
        self.assertEqual(self.holds(), [])
        self.assertEqual(os.listdir(os.path.join(self.dir, "tmp")), [])

    def test_on_an_allocator_without_discard_a_failed_wake_unmaps_what_it_mapped_and_nothing_else(self):
        worker = self.load()
        expected = self.answer(worker)
        worker.sleep(1)
        driver = self.fail_next_wake_after(worker, 2)
        saved = cumem.CuMemAllocator.discard, cumem.CuMemAllocator.sleep

        def sleep(allocator, offload_tags=None):  # main's at e5337d96 unmaps every allocation, asleep or not
            raise AssertionError("a sleep after a failed wake would unmap the allocations asleep already")

        del cumem.CuMemAllocator.discard
        cumem.CuMemAllocator.sleep = sleep
        try:
            with self.assertRaises(WakeFailed):
                worker.wake_up(None)
        finally:
            cumem.CuMemAllocator.discard, cumem.CuMemAllocator.sleep = saved
        self.assertTrue(driver.failed)
        self.assertEqual(self.asleep(), {"weights", "kv_cache"})
        worker.wake_up(None)
        self.assertEqual(self.answer(worker), expected)

    def test_an_entry_changed_behind_its_back_is_found_before_the_engine_serves(self):
        worker = self.load()
        worker.sleep(1)
        victim = sorted(glob.glob(os.path.join(self.dir, "entries", "*")))[0]
        with open(victim, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
        with self.assertRaisesRegex(WakeFailed, "do not match what was put to sleep"):
            worker.wake_up(None)
        self.assertIn("weights", self.asleep())


def tier_mappings(path):
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if os.path.join(path, "entries") in line or os.path.join(path, "tmp") in line)


class MappingTest(BackendTest):
    def test_the_entries_stay_mapped_and_page_locked_from_sleep_to_wake_then_are_let_go(self):
        calls = []

        class Locking(drivers.HostDriver):
            def host_register(self, device, address, size):
                calls.append(("register", address))
                return True

            def host_unregister(self, device, address):
                calls.append(("unregister", address))

        worker = self.load()
        expected = self.answer(worker)
        worker._get_sleep_mode_backend()._driver = Locking()
        for level in (1, 2):
            worker.sleep(level)
            held = len(self.tier.entries())
            self.assertEqual(tier_mappings(self.dir), held)
            self.assertEqual(sorted(a for k, a in calls if k == "register"), sorted(m[0] for m in worker._sleep_mode_backend._maps.values()))
            self.wake(worker)
            worker._sleep_mode_backend._settle()  # page-locked entries are let go after the wake returned
            self.assertEqual(tier_mappings(self.dir), 0)
            self.assertEqual(self.holds(), [])
            self.assertEqual(sorted(a for k, a in calls if k == "unregister"), sorted(a for k, a in calls if k == "register"))
            self.assertEqual(self.answer(worker), expected)
            calls.clear()

    def test_page_locked_entries_are_let_go_after_the_wake_returned_and_the_next_sleep_waits_for_it(self):
        go = threading.Event()
        unlocked = []

        class SlowUnlock(drivers.HostDriver):
            def host_register(self, device, address, size):
                return True

            def host_unregister(self, device, address):
                go.wait(10)  # held until the test lets it go (10 s: a wake that waited for it still ends)
                unlocked.append(address)

        worker = self.load()
        expected = self.answer(worker)
        worker._get_sleep_mode_backend()._driver = SlowUnlock()
        worker.sleep(1)
        held = tier_mappings(self.dir)
        worker.wake_up(None)  # returns with the entries still mapped, page-locked and held
        self.assertEqual(self.answer(worker), expected)
        self.assertEqual((unlocked, tier_mappings(self.dir), len(self.holds())), ([], held, 1))
        go.set()
        worker.sleep(1)  # waits for the let-go first: this sleep's mappings only, one hold
        self.assertEqual(len(unlocked), held)
        self.assertEqual((tier_mappings(self.dir), len(self.holds())), (held, 1))
        worker.wake_up(None)
        worker._sleep_mode_backend._settle()
        self.assertEqual((tier_mappings(self.dir), self.holds()), (0, []))
        self.assertEqual(self.answer(worker), expected)

    def test_a_tmpfs_without_room_for_an_entry_keeps_vllm_s_host_copy(self):
        import errno

        worker = self.load()
        expected = self.answer(worker)
        real = os.posix_fallocate

        def full(fd, offset, size):
            raise OSError(errno.ENOSPC, "No space left on device")

        os.posix_fallocate = full
        try:
            with self.assertLogs("vsnap_vllm", level="WARNING") as logs:
                worker.sleep(1)
        finally:
            os.posix_fallocate = real
        self.assertIn("No space left on device", logs.output[0])
        self.assertEqual((self.holds(), tier_mappings(self.dir), os.listdir(os.path.join(self.dir, "tmp"))), ([], 0, []))
        self.wake(worker)
        self.assertEqual(self.answer(worker), expected)


class FullTierTest(BackendTest):
    budget = 64 << 10  # one host region: the weights do not fit

    def test_a_full_tier_keeps_vllm_s_host_copy_at_level_1_and_refuses_level_2(self):
        worker = self.load()
        expected = self.answer(worker)
        self.assertGreater(weights_bytes(worker), self.budget)
        with self.assertLogs("vsnap_vllm", level="WARNING") as logs:
            worker.sleep(1)
        self.assertIn("keeps vLLM's own host copy", logs.output[0])
        self.assertEqual(self.tier.used_bytes(), 0)
        self.assertEqual(self.holds(), [])
        self.wake(worker)
        self.assertEqual(self.answer(worker), expected)
        with self.assertRaisesRegex(SleepRefused, "more do not fit .a larger tier budget"):
            worker.sleep(2)
        self.assertEqual(self.asleep(), set())


if __name__ == "__main__":
    unittest.main()
