"""`LLM.sleep()` / `LLM.wake_up()` through the `vsnap` sleep-mode backend: vLLM's offline entry
point of the reference engine (vllm/entrypoints/llm.py -> LLMEngine -> engine-core client ->
EngineCore -> executor -> every worker's sleep / wake_up -> the backend), driven the way RL
frameworks drive vLLM, by scripts (llm_scenarios.py) each in a process of its own with
VLLM_PLUGINS=vsnap: the engine core in that process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as RL
frameworks run it) and in a background process (vLLM's default). Host memory."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests import support, web_support
from vsnap_vllm.ram_tier import RamTier

REFUSED = "level-2 sleep refused, nothing released"


def run(scenario, tier, multiprocessing, extra_env=None):
    env = {**os.environ, **(extra_env or {}), "VLLM_PLUGINS": "vsnap", "VSNAP_RAM_TIER": tier, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocessing else "0",
           "PYTHONPATH": os.pathsep.join((web_support.plugin_site(), support.PLUGIN))}
    proc = subprocess.run([sys.executable, "-m", "tests.llm_scenarios", scenario], cwd=support.PLUGIN, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"scenario {scenario} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


class TierCase(unittest.TestCase):
    """A fresh RAM tier of `budget` bytes for each test."""

    multiprocessing = False
    budget = 1 << 30
    env = {}

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vsnap-ram-")
        RamTier.init(self.dir, self.budget)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_scenario(self, name):
        return run(name, self.dir, self.multiprocessing, self.env)

    def assert_slept_in_the_tier(self, out):
        """What only the vsnap backend does: the weights' bytes in the shared tier, held once for
        this engine, and no host copy of vLLM's own (cumem makes one at level 1)."""
        self.assertEqual(out["backend"][0]["class"], "vsnap_vllm.sleep_backend.VsnapSleepBackend")
        slept = out["slept1"]
        self.assertGreater(slept["tier"]["used"], 0)
        self.assertEqual(slept["tier"]["holds"], 1)
        if slept["allocator"] is not None:
            self.assertEqual(slept["tier"]["used"], slept["allocator"]["weights_bytes"])
            self.assertEqual(slept["allocator"]["host_copies"], 0)


    def assert_asleep(self, seen, tags):
        if seen["allocator"]["asleep"] is not None:  # None: an allocator without is_asleep (vLLM's own, on the GPU)
            self.assertEqual(seen["allocator"]["asleep"], tags)


class LlmSleepTest(TierCase):
    def test_level_1_and_2_by_tags_through_llm_sleep_and_wake_up(self):
        out = self.run_scenario("levels")
        expected = out["expected"]
        self.assert_slept_in_the_tier(out)
        # level 2 before the tier holds the weights: refused, nothing released, the engine serves
        self.assertIn(REFUSED, out["level2_first"])
        self.assertEqual(out["after_refusal"]["memory_asleep"], [False])
        if not self.multiprocessing:
            self.assertTrue(out["level2_first"].startswith("SleepRefused: "))  # the backend's own error, in-process
            self.assert_asleep(out["after_refusal"], [])
        self.assertEqual(out["answer_after_refusal"], expected)
        self.assertTrue(out["slept1"]["sleeping"])
        self.assertEqual(out["slept1"]["state"], "SUSPENDED")
        self.assertEqual(out["woke1"], {"answer": expected, "tier": {"used": out["slept1"]["tier"]["used"], "holds": 0}})
        # wake_up(tags=["weights"]), then ["kv_cache"]
        self.assertTrue(out["woke_weights"]["sleeping"])
        self.assertEqual(out["woke_weights"]["state"], "SUSPENDED")
        if not self.multiprocessing:
            self.assert_asleep(out["woke_weights"], ["kv_cache"])
        self.assertEqual(out["woke_kv"], {"sleeping": False, "answer": expected})
        # level 2 once the tier holds them: accepted, and the wake needs no reload_weights
        self.assertIsNone(out["level2"])
        self.assertEqual(out["slept2"]["tier"]["holds"], 1)
        if not self.multiprocessing:
            self.assert_asleep(out["slept2"], ["kv_cache", "weights"])
        self.assertEqual(out["woke2"]["answer"], expected)
        self.assertEqual(out["woke2"]["weight_loads"], [1])
        self.assertEqual(out["woke2"]["tier"]["holds"], 0)

    def test_the_rl_loop_wakes_with_the_weights_pushed_never_the_tier_s_older_copy(self):
        out = self.run_scenario("rl_loop")
        self.assertTrue(out["vsnap_methods"])  # vsnap's worker methods beside the trainer's own extension
        original, steps = out["original"], out["steps"]
        self.assertNotEqual(steps[0]["pushed"], original)
        self.assertNotEqual(steps[1]["pushed"], steps[0]["pushed"])
        self.assertEqual(steps[2]["pushed"], original)  # seed 1 again: the model it started as
        for step in steps:
            self.assertEqual(step["after_wake"], step["pushed"])
        self.assertEqual(out["tier"]["holds"], 0)


class LlmSleepMultiprocessTest(LlmSleepTest):
    multiprocessing = True


class LlmSleepBeforePr52514Test(TierCase):
    """vLLM before PR #52514 (as its own cumem.py at e5337d96, which the GPU suite runs): the
    allocator says nothing of which allocations sleep (no AllocationData.is_asleep), so the
    backend's state() after a wake of the weights alone must come from its own count of tags."""

    env = {"VSNAP_REF_WAKE_ALL": "1"}
    test_level_1_and_2_by_tags_through_llm_sleep_and_wake_up = LlmSleepTest.test_level_1_and_2_by_tags_through_llm_sleep_and_wake_up


class SelectedBackendTest(TierCase):
    def test_the_tier_checks_fail_for_vllm_s_cumem_backend(self):
        out = self.run_scenario("levels_cumem")
        self.assertEqual(out["backend"][0]["class"], "vllm.device_allocator.sleep_mode_backend.CuMemBackend")
        with self.assertRaises(AssertionError):
            self.assert_slept_in_the_tier(out)
        self.assertGreater(out["slept1"]["allocator"]["host_copies"], 0)  # cumem's own host copy
        self.assertIsNone(out["level2_first"])  # cumem discards the weights at level 2 without asking


class FullTierTest(TierCase):
    budget = 64 << 10  # one host region: the weights do not fit

    def test_level_2_is_refused_with_nothing_released_and_level_1_keeps_vllm_s_host_copy(self):
        out = self.run_scenario("full_tier")
        self.assertIn(REFUSED, out["level2"])
        self.assertIn("a larger tier budget", out["level2"])
        self.assertEqual(out["after_refusal"]["memory_asleep"], [False])
        self.assert_asleep(out["after_refusal"], [])
        self.assertEqual(out["answer_after_refusal"], out["expected"])
        self.assertEqual(out["slept1"]["tier"], {"used": 0, "holds": 0})
        self.assertGreater(out["slept1"]["allocator"]["host_copies"], 0)
        self.assertEqual(out["woke1"], out["expected"])


if __name__ == "__main__":
    unittest.main()
