"""bench/engine-profile.py end to end on a host-memory reference engine: it starts the engine with
VSNAP_PROFILE, drives the SDK's calls, and its merged table holds, inside each operation, the
steps of every process (HTTP, engine core, worker, hooks, allocator calls per allocation); the
tier-0 cycle gives back the recorded answer; the frozen and unfrozen GC heaps both run."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from tests import support

BENCH = os.path.join(support.ROOT, "bench", "engine-profile.py")


class EngineProfileBenchTest(unittest.TestCase):
    def test_host_run(self):
        with tempfile.TemporaryDirectory() as out:
            run = subprocess.run([sys.executable, BENCH, "--device", "host", "--layers", "2", "--reps", "1", "--out", out],
                                 capture_output=True, text=True, timeout=240, env={k: v for k, v in os.environ.items() if k != "VSNAP_PROFILE"})
            self.assertEqual(run.returncode, 0, run.stderr[-3000:])
            self.assertIn("| tier0 | **wake weights + adopt** |", run.stdout)
            with open(os.path.join(out, "engine-profile.md")) as f:
                self.assertIn("variant nofreeze", f.read())
            for variant in ("freeze", "nofreeze"):
                with open(os.path.join(out, f"engine-profile-{variant}.json")) as f:
                    result = json.load(f)
                self.assertEqual(result["tier0Mismatches"], 0)
                regions = result["regions"][0]
                merged = {(m["cycle"], m["op"]): {s["step"]: s for s in m["steps"]} for m in result["merged"]}
                sleep = merged[("ram", "sleep level 2")]
                for step in ("http POST /vsnap/v1/sleep", "vsnap.route sleep", "client sleep", "core sleep", "worker sleep level=2",
                             "alloc CuMemAllocator.sleep", "alloc gc.collect"):
                    self.assertIn(step, sleep)
                self.assertEqual(sleep["vsnap.hook before_unmap"]["count"], regions)
                self.assertGreater(sleep["alloc unmap_and_release"]["count"], regions)  # the KV cache too
                wake = merged[("ram", "wake weights")]
                self.assertEqual(wake["alloc create_and_map"]["count"], regions)
                self.assertEqual(wake["vsnap.hook on_create"]["count"], regions)
                adopt = merged[("tier0", "wake weights + adopt")]
                for step in ("vsnap adopt", "vsnap adopt.fetch_fds", "vsnap.hook on_create"):
                    self.assertIn(step, adopt)
                self.assertIn("vsnap export.export_fds", merged[("ram", "export")])
                self.assertIn("worker generate", merged[("tier0", "check cold")])
                self.assertIn("core.rpc discard", merged[("release", "release kv_cache")])
                # every operation is found in the engine's records: at least one HTTP request of
                # its own started inside its client window (how long the server's span lasts is
                # not compared with the client's time: under load the server's span can end after
                # the client has its answer, and a run failed that way on a 2-core machine)
                for (cycle, name), steps in merged.items():
                    http = [s for s in steps.values() if s["step"].startswith("http ")]
                    self.assertTrue(http and all(s["count"] >= 1 for s in http), f"{cycle} {name}: no HTTP request recorded in its window")


if __name__ == "__main__":
    unittest.main()
