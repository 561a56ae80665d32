"""The shared RAM tier of the `vsnap` sleep-mode backend: a budget over every engine's entries,
entries no live engine holds evicted least recently used first, a hold of a process that is gone
freed, an admission that cannot fit refused with nothing evicted or held, an entry visible only
once complete."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests import support  # noqa: F401 - the plugin on sys.path
from vsnap_vllm import settings
from vsnap_vllm.ram_tier import RamTier, TierFull, TierUnavailable, main, parse_size


def fill(byte):
    return lambda address: __import__("ctypes").memset(address, byte, 4096)


class RamTierTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vsnap-ram-")
        self.tier = RamTier.init(self.dir, 3 * 4096)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def put(self, owner, key):
        for k in self.tier.admit(owner, {key: 4096}):
            self.tier.write(k, 4096, fill(1))

    def test_unheld_entries_are_evicted_oldest_first_held_ones_never(self):
        self.put("a", "k1-4096")
        self.put("b", "k2-4096")
        self.put("c", "k3-4096")
        self.tier.release("a")
        self.tier.release("c")
        os.utime(os.path.join(self.dir, "entries", "k3-4096"), (1, 1))  # k3 used longest ago
        self.put("d", "k4-4096")
        self.assertEqual(sorted(self.tier.entries()), ["k1-4096", "k2-4096", "k4-4096"])
        with self.assertRaises(TierFull):
            self.tier.admit("e", {"k5-4096": 4096, "k6-4096": 4096})  # only k1 is free
        self.assertEqual(sorted(self.tier.entries()), ["k1-4096", "k2-4096", "k4-4096"])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "holds", "e.json")))

    def test_a_hold_of_a_process_that_is_gone_is_freed(self):
        self.put("a", "k1-4096")
        self.put("b", "k2-4096")
        self.put("c", "k3-4096")
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
        with open(os.path.join(self.dir, "holds", "a.json"), "w") as f:
            json.dump({"pid": int(gone), "keys": ["k1-4096"]}, f)
        self.put("d", "k4-4096")
        self.assertNotIn("k1-4096", self.tier.entries())
        self.assertFalse(os.path.exists(os.path.join(self.dir, "holds", "a.json")))

    def test_an_entry_appears_only_once_written_and_a_failed_write_leaves_nothing(self):
        def boom(address):
            raise RuntimeError("copy failed")

        with self.assertRaises(RuntimeError):
            self.tier.write("k9-4096", 4096, boom)
        self.assertFalse(self.tier.has("k9-4096"))
        self.assertEqual(os.listdir(os.path.join(self.dir, "tmp")), [])

    def test_no_tier_says_how_to_make_one(self):
        with self.assertRaisesRegex(TierUnavailable, "VSNAP_RAM_TIER"):
            RamTier.open(None)
        for env in ({}, {"VSNAP_RAM_TIER": ""}):  # unset and empty alike: no tier
            self.assertIsNone(settings.ram_tier_dir(env))
        self.assertEqual(settings.ram_tier_dir({"VSNAP_RAM_TIER": self.dir}), self.dir)
        with self.assertRaisesRegex(TierUnavailable, "ram_tier init /nowhere"):
            RamTier.open("/nowhere")

    def test_sizes_and_the_command(self):
        self.assertEqual(parse_size("64GiB"), 64 << 30)
        self.assertEqual(parse_size("512 MiB"), 512 << 20)
        self.assertEqual(parse_size("1000"), 1000)
        with self.assertRaises(ValueError):
            parse_size("lots")
        self.assertEqual(main(["init", self.dir, "--budget", "1MiB"]), 0)
        self.assertEqual(RamTier.open(self.dir).budget, 1 << 20)


if __name__ == "__main__":
    unittest.main()
