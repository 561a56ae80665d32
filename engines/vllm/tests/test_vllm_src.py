"""vLLM's own allocator code in the reference engine (VSNAP_VLLM_SRC, assembled by
test/fixtures/engine/vllm_src.py): main's layout (vllm/device_allocator/cumem.py) by default, the
closed restructure PR's (vllm/backends/platform/device_allocator/) as a variant; the commit the
files came from is recorded; and the reference engine loads main's files as vllm.device_allocator
itself, the plugin wrapping the real module. CPU only: the files here are small fakes at vLLM's
paths (the GPU suites run the real ones)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from tests import support

sys.path.insert(0, support.FIXTURE)
import vllm_src  # noqa: E402

FAKE_INIT = """import dataclasses
from vllm.platforms import current_platform
HandleType = tuple
@dataclasses.dataclass
class AllocationData:
    handle: tuple
    tag: str
    cpu_backup_tensor: object = None
    is_asleep: bool = False
REAL_PACKAGE = True
"""
FAKE_CUMEM = """from vllm.device_allocator import AllocationData, HandleType
from vllm.logger import init_logger
from vllm.utils.platform_utils import is_pin_memory_available
from vllm.utils.system_utils import find_loaded_library
def create_and_map(handle):
    pass
def unmap_and_release(handle):
    pass
class CuMemAllocator:
    instance = None
"""
FAKE_BACKENDS = """import vllm.envs as envs
from vllm.logger import init_logger
from vllm.utils.mem_constants import GiB_bytes
class SleepModeBackendFactory:
    REAL = True
"""


def tree(layout, shim=False):
    root = tempfile.mkdtemp(prefix=f"vllm-{layout}-")
    for path in vllm_src.LAYOUTS[layout]:
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(FAKE_CUMEM if path.endswith("cumem.py") else FAKE_INIT if path.endswith("__init__.py")
                    else FAKE_BACKENDS if path.endswith("sleep_mode_backend.py") else f"// {path}\n")
    if shim:  # the restructure also leaves a shim at main's path
        os.makedirs(os.path.join(root, "vllm", "device_allocator"), exist_ok=True)
        with open(os.path.join(root, "vllm", "device_allocator", "cumem.py"), "w") as f:
            f.write("# COMPAT SHIM (auto-generated): old path -> canonical new path\n")
    return root


class AssembleTest(unittest.TestCase):
    def test_main_layout_is_the_default_and_the_commit_is_recorded(self):
        source, dest = tree("main"), tempfile.mkdtemp()
        layout, lines = vllm_src.assemble(source, dest, commit="a" * 40)
        self.assertEqual(layout, "main")
        self.assertEqual([l.split()[0] for l in lines], vllm_src.LAYOUTS["main"])
        with open(os.path.join(dest, "MANIFEST.txt")) as f:
            text = f.read()
        self.assertIn("layout main", text)
        self.assertIn("a" * 40, text)
        self.assertEqual(vllm_src.check(dest), [])
        with open(os.path.join(dest, "vllm/device_allocator/cumem.py"), "a") as f:
            f.write("# changed\n")
        self.assertEqual(vllm_src.check(dest), ["vllm/device_allocator/cumem.py"])

    def test_the_restructure_layout_is_a_variant_told_apart_by_its_shims(self):
        source = tree("restructure", shim=True)
        self.assertEqual(vllm_src.layout_of(source), "restructure")
        layout, _ = vllm_src.assemble(source, tempfile.mkdtemp(), commit="b" * 40)
        self.assertEqual(layout, "restructure")

    def test_a_folder_that_is_not_a_checkout_needs_the_commit(self):
        with self.assertRaises(SystemExit) as e:
            vllm_src.assemble(tree("main"), tempfile.mkdtemp())
        self.assertIn("--commit", str(e.exception))

    def test_files_fetched_from_different_commits_record_each_its_own(self):
        files = vllm_src.LAYOUTS["main"]
        every, per_file = vllm_src.commits_of(["e" * 40, f"{files[1]}={'f' * 40}", f"{files[2]}=0123abc"])
        dest = tempfile.mkdtemp()
        _, lines = vllm_src.assemble(tree("main"), dest, commit={None: every, **per_file})
        recorded = {l.split()[0]: l.split()[1] for l in lines}
        self.assertEqual(recorded, {**{f: "e" * 40 for f in files}, files[1]: "f" * 40, files[2]: "0123abc"})
        with open(os.path.join(dest, "MANIFEST.txt")) as f:
            self.assertIn(f"{files[1]} {'f' * 40} ", f.read())
        self.assertEqual(vllm_src.check(dest), [])

    def test_per_file_commits_must_cover_every_file_of_a_folder_that_is_not_a_checkout(self):
        files = vllm_src.LAYOUTS["main"]
        with self.assertRaises(SystemExit) as e:
            vllm_src.assemble(tree("main"), tempfile.mkdtemp(), commit={p: "a" * 40 for p in files[:3]})
        self.assertIn(files[3], str(e.exception))
        _, lines = vllm_src.assemble(tree("main"), tempfile.mkdtemp(), commit={p: "a" * 40 for p in files})
        self.assertEqual(len(lines), len(files))

    def test_commits_that_are_not_commits_or_name_other_files_are_refused(self):
        for values in (["main"], ["e" * 41], ["ABCDEF1"], ["e" * 40, "f" * 40]):
            with self.assertRaises(SystemExit, msg=values):
                vllm_src.commits_of(values)
        with self.assertRaises(SystemExit) as e:
            vllm_src.assemble(tree("main"), tempfile.mkdtemp(), commit={None: "a" * 40, "vllm/other.py": "b" * 40})
        self.assertIn("vllm/other.py", str(e.exception))


PROBE = """
import json, sys
sys.path[:0] = [%r, %r]
import vllm.device_allocator as pkg
import vllm.device_allocator.cumem as cumem
from vllm_vsnap_probe import adapter
import vllm.device_allocator.sleep_mode_backend as backends
print(json.dumps({"real": getattr(pkg, "REAL_PACKAGE", False), "cumem": cumem.__file__,
                  "wrapped": adapter._cumem().__file__, "backends": backends.__file__}))
""".replace("vllm_vsnap_probe", "vsnap_vllm")


class LoadTest(unittest.TestCase):
    def test_main_s_files_are_vllm_device_allocator_itself(self):
        dest = tempfile.mkdtemp()
        vllm_src.assemble(tree("main"), dest, commit="c" * 40)
        env = {**os.environ, "VSNAP_REF_DEVICE": "cuda", "VSNAP_VLLM_SRC": dest}
        out = subprocess.run([sys.executable, "-c", PROBE % (support.FIXTURE, support.PLUGIN)], env=env, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        r = json.loads(out.stdout)
        real = os.path.join(dest, "vllm", "device_allocator", "cumem.py")
        self.assertTrue(r["real"])
        self.assertEqual((r["cumem"], r["wrapped"]), (real, real))
        self.assertEqual(r["backends"], os.path.join(dest, "vllm", "device_allocator", "sleep_mode_backend.py"))

    def test_a_main_folder_taken_before_the_backends_falls_back_to_the_stand_in_s(self):
        dest = tempfile.mkdtemp()
        vllm_src.assemble(tree("main"), dest, commit="c" * 40)
        os.remove(os.path.join(dest, "vllm", "device_allocator", "sleep_mode_backend.py"))
        env = {**os.environ, "VSNAP_REF_DEVICE": "cuda", "VSNAP_VLLM_SRC": dest}
        out = subprocess.run([sys.executable, "-c", PROBE % (support.FIXTURE, support.PLUGIN)], env=env, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout)["backends"], os.path.join(support.FIXTURE, "vllm", "device_allocator", "sleep_mode_backend.py"))

    def test_the_restructure_variant_loads_from_vllm_backends(self):
        dest = tempfile.mkdtemp()
        vllm_src.assemble(tree("restructure"), dest, commit="d" * 40)
        env = {**os.environ, "VSNAP_REF_DEVICE": "cuda", "VSNAP_VLLM_SRC": dest}
        out = subprocess.run([sys.executable, "-c", PROBE % (support.FIXTURE, support.PLUGIN)], env=env, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        r = json.loads(out.stdout)
        real = os.path.join(dest, "vllm", "backends", "platform", "device_allocator", "cumem.py")
        self.assertTrue(r["real"])
        self.assertEqual((r["cumem"], r["wrapped"]), (real, real))


if __name__ == "__main__":
    unittest.main()
