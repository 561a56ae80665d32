#!/usr/bin/env python3
"""The vLLM plugin's per-region cost in Python, without a GPU (issue 25).

The plugin drives CUDA's virtual memory calls through ctypes, once per weights region: on every
wake `Exporter.create_on_wake` (cuMemCreate + cuMemMap + cuMemSetAccess), on every export
`Exporter.export_fds` (cuMemExportToShareableHandle), on a tier-0 wake `Exporter.adopt`
(cuMemImportFromShareableHandle + cuMemMap + cuMemSetAccess). This times those three against a
stand-in libcuda (engines/vllm/tests/fake_libcuda.c, built here with cc) whose entry points do
nothing and answer success: what is left is exactly the ctypes and Python cost per region, the
part the plugin can cut. The driver's own time (measured on an H200: 65 us per region for the
wake, 32 us for the export, bench/results/2026-12-01-h200-engine-profile.md) is not in it.

    python3 bench/plugin-driver.py [--regions 252,4000] [--rounds 30] [--repeat 3] [--against REV] [--freeze] [--json FILE]

--against REV times the plugin of that git revision too (its vsnap_vllm/ taken with `git
archive`). Each plugin runs in its own processes, alternated --repeat times (a shared machine
drifts); per region: the median over the rounds of (round time / regions), in microseconds, the
best of the processes. The GC runs as it does in the engine unless --freeze (gc.freeze() after
set-up, as vLLM does after warm-up).
"""

import argparse
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FAKE = os.path.join(ROOT, "engines", "vllm", "tests", "fake_libcuda.c")
SIZE = 64 << 20  # a region's size: what the fake ignores, what a 16 GiB engine's 252 regions are


def build_fake(out_dir):
    lib = os.path.join(out_dir, "libfakecuda.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, FAKE], check=True)
    return lib


def child(package_dir, lib, counts, rounds, freeze):
    """Runs in its own process: the plugin found under `package_dir`, the fake libcuda `lib`."""
    sys.path.insert(0, package_dir)
    from vsnap_vllm.adapter import Allocation
    from vsnap_vllm.drivers import CudaDriver
    from vsnap_vllm.exportable import Exporter

    driver = CudaDriver(library=lib)
    out = {}
    for n in counts:
        slots = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(slots)
        allocations = [Allocation(device=0, size=SIZE, va=0x7F0000000000 + i * SIZE, handle_slot=base + 8 * i, tag="weights") for i in range(n)]
        times = {"create+map": [], "export": [], "import+map": [], "create+map+export, one pass": []}
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            for r in range(rounds + 1):  # the first round warms up
                exporter = Exporter(driver)
                exporter.kinds.update((a.va, "posix-fd") for a in allocations)  # classified at load
                if freeze:
                    gc.collect()
                    gc.freeze()
                t0 = time.perf_counter()
                for a in allocations:  # what vLLM's wake calls, one allocation at a time (the on_create hook)
                    exporter.create_on_wake(a)
                t1 = time.perf_counter()
                exporter.make_all_exportable(allocations)  # what Bridge.export runs: nothing to rehome after a wake
                fds = exporter.export_fds(allocations)
                t2 = time.perf_counter()
                assert len(fds) == n
                exporter.forget()  # sleep: what was known of the handles goes
                # tier 0: descriptors handed back by the SDK, mapped back one allocation at a time
                # (the fake ignores them; real ones, since the exporter keeps and later closes them)
                handed = [os.dup(devnull) for _ in range(n)]
                t3 = time.perf_counter()
                for a, fd in zip(allocations, handed):
                    exporter.adopt(a, fd, in_place=False)
                t4 = time.perf_counter()
                exporter.forget()
                # Not what the plugin does: the export made in the wake's pass, right after each
                # create (the export would then hand over what the wake made). Measured to see
                # whether it pays: it saves no driver call, only the export pass's own loop.
                exporter = Exporter(driver)
                t5 = time.perf_counter()
                early = {}
                for a in allocations:
                    exporter.create_on_wake(a)
                    early[a.va] = driver.export_fd(a.device, a.handle)
                t6 = time.perf_counter()
                assert len(early) == n
                if freeze:
                    gc.unfreeze()
                if r == 0:
                    continue
                times["create+map+export, one pass"].append((t6 - t5) / n * 1e6)
                times["create+map"].append((t1 - t0) / n * 1e6)
                times["export"].append((t2 - t1) / n * 1e6)
                times["import+map"].append((t4 - t3) / n * 1e6)
        finally:
            os.close(devnull)
        out[str(n)] = {k: {"median": statistics.median(v), "min": min(v)} for k, v in times.items()}
    print(json.dumps(out))


def package_of(rev, into):
    """The plugin at git revision `rev`, unpacked under `into`; returns the folder holding vsnap_vllm."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", rev, "engines/vllm/vsnap_vllm"], check=True, capture_output=True).stdout
    path = os.path.join(into, "plugin.tar")
    with open(path, "wb") as f:
        f.write(archive)
    with tarfile.open(path) as t:
        t.extractall(into)
    return os.path.join(into, "engines", "vllm")


def run(package_dir, lib, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", package_dir, "--lib", lib, "--regions", args.regions, "--rounds", str(args.rounds)]
    if args.freeze:
        cmd.append("--freeze")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regions", default="252,4000")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--against", help="a git revision whose plugin is timed too (before/after)")
    p.add_argument("--repeat", type=int, default=3, help="processes per plugin, alternated (default 3)")
    p.add_argument("--freeze", action="store_true", help="gc.freeze() after set-up, as vLLM does")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--lib", help=argparse.SUPPRESS)
    args = p.parse_args()
    counts = [int(x) for x in args.regions.split(",") if x.strip()]
    if args.child:
        child(args.child, args.lib, counts, args.rounds, args.freeze)
        return
    work = tempfile.mkdtemp(prefix="vsnap-plugin-driver-")
    try:
        lib = build_fake(work)
        packages = {"this tree": os.path.join(ROOT, "engines", "vllm")}
        if args.against:
            packages[args.against] = package_of(args.against, work)
        # Each plugin in its own process, the processes alternated --repeat times (a shared or
        # busy machine drifts): per figure, the best of the processes' medians and fastest rounds.
        runs = {k: [] for k in packages}
        for _ in range(args.repeat):
            for k, path in packages.items():
                runs[k].append(run(path, lib, args))
        results = {k: {n: {op: {"median": min(r[n][op]["median"] for r in rs), "min": min(r[n][op]["min"] for r in rs)} for op in rs[0][n]} for n in rs[0]} for k, rs in runs.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = list(results)
    print("create+map: Exporter.create_on_wake per allocation (the wake's on_create hook); export: Exporter.make_all_exportable + export_fds of all (what Bridge.export runs); "
          "import+map: Exporter.adopt per allocation (a tier-0 wake); one pass: create_on_wake then export_fd per allocation (not what the plugin does)")
    print(f"plugin per-region Python/ctypes cost against a no-op libcuda, us per region (median, in brackets the fastest, of {args.rounds} rounds; best of {args.repeat} processes{', GC frozen' if args.freeze else ''}); python {sys.version.split()[0]}")
    head = ["regions", "operation", *names] + (["this tree / " + names[1] + " (medians)"] if len(names) > 1 else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---:"] * len(head)) + "|")
    for n in counts:
        for op in ("create+map", "export", "import+map", "create+map+export, one pass"):
            cells = [f"{results[k][str(n)][op]['median']:.2f} ({results[k][str(n)][op]['min']:.2f})" for k in names]
            if len(names) > 1:
                cells.append(f"{results[names[0]][str(n)][op]['median'] / results[names[1]][str(n)][op]['median']:.2f}x")
            print(f"| {n} | {op} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "repeat": args.repeat, "freeze": args.freeze, "python": sys.version.split()[0], "results": results, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
