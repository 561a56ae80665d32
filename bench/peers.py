"""Peer alternatives to vsnap on the same bytes (issue 5's benchmark table), device only.

  safetensors     save_file from cuda (with and without os.sync); load_file to cuda, cold and warm
  torch_copy      torch pinned allocation cost; copy_ H2D / D2H from pinned memory; pageable H2D
  checkpoint      cuCheckpointProcess{Lock,Checkpoint,Restore,Unlock} on a child holding the bytes
  engine_reload   the reference engine's state_dict reloaded from safetensors (vLLM reload_weights)

Usage: python3 bench/peers.py --gib 16 --out results/peers-16GiB.json [--reps 3] [--skip NAME,...] [--dry-run]
Writes the JSON to --out (and stdout) and a markdown table next to it (.md); files go to $TMPDIR."""

import argparse
import ctypes
import datetime
import gc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

MiB = 1 << 20
GiB = 1 << 30
ENGINE_DIR = Path(__file__).resolve().parent.parent / "test/fixtures/engine"
ENGINE_LAYERS, ENGINE_HIDDEN = 36, 4096  # the swap bench's engine


def region_sizes(total):
    """Same as bench/transfer.ts: embeddings and head of 1 GiB, norms of 2 MiB, layers of 448 MiB."""
    sizes = [GiB, GiB, 2 * MiB, 2 * MiB]
    left = total - sum(sizes)
    while left >= 448 * MiB:
        sizes.append(448 * MiB)
        left -= 448 * MiB
    if left >= 2 * MiB:
        sizes.append(left // (2 * MiB) * 2 * MiB)
    return sizes


def fill_value(i):
    return (i * 37 + 1) & 0xFF  # distinct per region, as the vsnap bench fills them


def log(msg):
    print(f"peers: {msg}", file=sys.stderr, flush=True)


def gbps(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 3) if seconds and seconds > 0 else None


def median(values):
    return sorted(values)[len(values) // 2]  # the upper median, like bench/transfer.ts


def repeated(nbytes, seconds):
    """{...Seconds: {min, median, runs}, ...GBps: {max, median, runs}} for repeated runs."""
    rates = [r for r in (gbps(nbytes, s) for s in seconds) if r is not None]
    return ({"min": round(min(seconds), 4), "median": round(median(seconds), 4), "runs": [round(s, 4) for s in seconds]},
            {"max": max(rates, default=None), "median": median(rates) if rates else None, "runs": rates})


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def drop_caches():
    """Makes the next read cold; needs root."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def nvidia_smi(*args):
    try:
        run = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
        return run.stdout if run.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_mib_of(pid):
    """GPU memory nvidia-smi lists for pid, or None when it lists none (e.g. after a checkpoint)."""
    out = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    found = [int(p[1]) for p in (line.split(",") for line in (out or "").splitlines())
             if len(p) == 2 and p[0].strip() == str(pid) and p[1].strip().isdigit()]
    return sum(found) if found else None


def gpu0_used_mib():
    out = (nvidia_smi("-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits") or "").split()
    return int(out[0]) if out and out[0].isdigit() else None


# ---------------------------------------------------------------- torch helpers (imported lazily)

def sync():
    import torch
    torch.cuda.synchronize()


def free_memory():
    """Returns GPU and pinned memory between sections so the next one starts clean."""
    import torch
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    host_empty = getattr(torch._C, "_host_emptyCache", None)  # torch's cached pinned blocks
    if host_empty:
        host_empty()


def make_regions(sizes):
    import torch
    regions = {f"model.layers.{i}.weight": torch.full((s,), fill_value(i), dtype=torch.uint8, device="cuda")
               for i, s in enumerate(sizes)}
    sync()
    return regions


def same_tensors(a, b):
    import torch
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def timed(fn):
    sync()  # earlier GPU work must not count
    t0 = time.perf_counter()
    value = fn()
    sync()
    return time.perf_counter() - t0, value


def timed_save(tensors, path, nbytes):
    """save_file, then os.sync (vsnap's capture row includes fdatasync); earlier dirty pages synced first."""
    from safetensors.torch import save_file
    os.sync()
    t0 = time.perf_counter()
    save_file(tensors, path)
    t1 = time.perf_counter()
    os.sync()
    t2 = time.perf_counter()
    return dict(saveSeconds=round(t1 - t0, 4), saveGBps=gbps(nbytes, t1 - t0),
                saveSyncedSeconds=round(t2 - t0, 4), saveSyncedGBps=gbps(nbytes, t2 - t0))


def cold_then_warm(res, name, run, nbytes, reps, no_cold=None):
    """One run after the page cache is dropped (<name>Cold...), then `reps` warm runs (<name>Warm...)."""
    if drop_caches():
        cold = run()
        res.update({f"{name}ColdSeconds": round(cold, 4), f"{name}ColdGBps": gbps(nbytes, cold)})
        log(f"{name} cold {cold:.3f} s")
    else:
        res.update({f"{name}ColdSeconds": None, f"{name}ColdGBps": None, **(no_cold or {}), "coldNote": "could not drop caches (not root?)"})
    res[f"{name}WarmSeconds"], res[f"{name}WarmGBps"] = repeated(nbytes, [run() for _ in range(reps)])


# ---------------------------------------------------------------- 1. safetensors

def bench_safetensors(sizes, scratch, reps):
    from safetensors.torch import load_file
    nbytes, verified = sum(sizes), []
    path = Path(scratch, "regions.safetensors")
    regions = make_regions(sizes)

    def load():
        gc.collect()
        seconds, loaded = timed(lambda: load_file(path, device="cuda"))
        if not verified:  # the first load is compared, cold or warm
            verified.append(same_tensors(loaded, regions))
        return seconds

    try:
        res = {**timed_save(regions, path, nbytes), "fileBytes": path.stat().st_size}
        log(f"safetensors save {res['saveGBps']} GB/s, with sync {res['saveSyncedGBps']} GB/s")
        cold_then_warm(res, "load", load, nbytes, reps, no_cold={"cold": None})
        res["verified"] = bool(verified[0])
        log(f"safetensors warm load {res['loadWarmGBps']['max']} GB/s, verified {res['verified']}")
        return res
    finally:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- 2. torch pinned copy

def bench_torch_copy(sizes, _scratch, reps):
    import torch
    nbytes, res = sum(sizes), {}
    gpu = list(make_regions(sizes).values())
    free_memory()  # cached pinned blocks would make the pinning look free
    t0 = time.perf_counter()
    host = [torch.empty(s, dtype=torch.uint8, pin_memory=True) for s in sizes]
    pin = time.perf_counter() - t0
    res.update(pinSeconds=round(pin, 4), pinSecondsPerGiB=round(pin / (nbytes / GiB), 4), pinGBps=gbps(nbytes, pin),
               pinNote="torch.empty(pin_memory=True): torch's caching host allocator (cudaHostAlloc), may round sizes up")

    def copy_all(dst, src):
        return lambda: [d.copy_(s, non_blocking=True) for d, s in zip(dst, src)]

    timed(copy_all(host, gpu))  # warm-up, untimed: also fills the host buffers
    h2d = [timed(copy_all(gpu, host))[0] for _ in range(reps)]
    d2h = [timed(copy_all(host, gpu))[0] for _ in range(reps)]
    res["h2dSeconds"], res["h2dGBps"] = repeated(nbytes, h2d)
    res["d2hSeconds"], res["d2hGBps"] = repeated(nbytes, d2h)
    log(f"torch pinned H2D {res['h2dGBps']['max']} GB/s, D2H {res['d2hGBps']['max']} GB/s, pin {res['pinSeconds']} s")
    del host
    free_memory()
    pageable = [torch.empty(s, dtype=torch.uint8).fill_(fill_value(i)) for i, s in enumerate(sizes)]  # faulted in, untimed
    seconds, _ = timed(lambda: [d.copy_(s) for d, s in zip(gpu, pageable)])
    res.update(pageableH2dSeconds=round(seconds, 4), pageableH2dGBps=gbps(nbytes, seconds))
    log(f"torch pageable H2D {res['pageableH2dGBps']} GB/s")
    return res


# ---------------------------------------------------------------- 3. CUDA process checkpoint

CHILD = r'''
import json, os, sys, torch
sizes = json.loads(sys.argv[1])
regions = [torch.full((s,), (i * 37 + 1) & 0xFF, dtype=torch.uint8, device="cuda:0") for i, s in enumerate(sizes)]
def checksums():
    return [int(torch.sum(t, dtype=torch.int64)) for t in regions]
def exact():
    return all(bool((t == ((i * 37 + 1) & 0xFF)).all()) for i, t in enumerate(regions))
before, ok = checksums(), exact()
torch.cuda.synchronize()
torch.cuda.empty_cache()  # nvidia-smi then shows the regions and the context only
print(f"READY {os.getpid()} {int(ok)}", flush=True)
sys.stdin.readline()
print("INTACT" if ok and exact() and checksums() == before else "CORRUPT", flush=True)
'''


class LockArgs(ctypes.Structure):  # CUcheckpointLockArgs
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class ReservedArgs(ctypes.Structure):  # CUcheckpointCheckpointArgs and CUcheckpointUnlockArgs
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class RestoreArgs(ctypes.Structure):  # CUcheckpointRestoreArgs
    _fields_ = [("gpuPairs", ctypes.c_void_p), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))), ("reserved1", ctypes.c_uint64)]


STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
ARGS = {"Lock": LockArgs, "Checkpoint": ReservedArgs, "Restore": RestoreArgs, "Unlock": ReservedArgs}
UNDO = {"Lock": "Unlock", "Checkpoint": "Restore"}  # a locked or checkpointed child may not die cleanly


class Driver:
    """The few libcuda entry points the checkpoint API needs, each CUresult checked."""

    def __init__(self):
        for struct in (LockArgs, ReservedArgs, RestoreArgs):
            assert ctypes.sizeof(struct) == 64, f"{struct.__name__} is not the header's 64 bytes"
        lib = self.lib = ctypes.CDLL("libcuda.so.1")
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuCheckpointProcessGetState.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        for name, args in ARGS.items():
            getattr(lib, f"cuCheckpointProcess{name}").argtypes = [ctypes.c_int, ctypes.POINTER(args)]
        self.call("cuInit", 0)  # restore needs cuInit (or persistence mode) in the caller

    def call(self, name, *args):
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        rc = fn(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(text))
            raise RuntimeError(f"{name} failed: {(text.value or b'?').decode()} ({rc})")

    def process(self, name, pid):
        args = LockArgs(timeoutMs=120_000) if name == "Lock" else ARGS[name]()
        self.call(f"cuCheckpointProcess{name}", pid, ctypes.byref(args))

    def state(self, pid):
        """For the record only: a failing GetState must not fail the measurement."""
        value = ctypes.c_int(-1)
        try:
            self.call("cuCheckpointProcessGetState", pid, ctypes.byref(value))
        except RuntimeError as exc:
            return f"unknown ({exc})"
        return STATES.get(value.value, str(value.value))


def child_lines(proc):
    """wait_for(prefixes, timeout): the child's next line starting so (select on the raw pipe, no hidden buffering)."""
    buf, seen = [b""], []

    def wait_for(prefixes, timeout):
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in buf[0]:
                line, buf[0] = buf[0].split(b"\n", 1)
                text = line.decode(errors="replace").strip()
                if text.startswith(prefixes):
                    return text
                seen.append(text)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"child said nothing of {prefixes} in {timeout} s: {' | '.join(seen[-5:])}")
            if select.select([proc.stdout], [], [], left)[0]:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"child exited ({proc.wait()}): {' | '.join(seen[-5:])}")
                buf[0] += chunk
    return wait_for


def bench_checkpoint(sizes, _scratch, _reps):
    nbytes, res, states, undo = sum(sizes), {}, [], []  # undo: what cleanup must call, last first
    cu = Driver()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(sizes)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    pid, wait_for = proc.pid, child_lines(proc)

    def timed_steps(*names):
        t0 = time.perf_counter()
        for name in names:
            cu.process(name, pid)
            if name in UNDO:
                undo.append(UNDO[name])
            else:
                undo.pop()  # the step undid the last one cleanup owed
        seconds = time.perf_counter() - t0
        states.append(cu.state(pid))
        return seconds

    try:
        words = wait_for(("READY",), 600).split()
        if words[2:3] != ["1"]:
            raise RuntimeError(f"child could not fill its regions: {' '.join(words)}")
        res.update(gpuMiBBefore=gpu_mib_of(pid), gpuTotalMiBBefore=gpu0_used_mib())
        states.append(cu.state(pid))
        checkpoint = timed_steps("Lock", "Checkpoint")
        res.update(gpuMiBAfter=gpu_mib_of(pid), gpuTotalMiBAfter=gpu0_used_mib())
        log(f"checkpoint {checkpoint:.3f} s; child GPU MiB {res['gpuMiBBefore']} -> {res['gpuMiBAfter']}")
        restore = timed_steps("Restore", "Unlock")
        res.update(checkpointSeconds=round(checkpoint, 4), restoreSeconds=round(restore, 4),
                   checkpointGBps=gbps(nbytes, checkpoint), restoreGBps=gbps(nbytes, restore),
                   gpuMiBRestored=gpu_mib_of(pid), states=states)
        if res["gpuMiBAfter"] is None:
            res["gpuMiBNote"] = "nvidia-smi did not list the child while checkpointed (null = none held)"
        proc.stdin.write(b"check\n")
        res["intact"] = wait_for(("INTACT", "CORRUPT"), 600) == "INTACT"
        log(f"restore {restore:.3f} s; intact {res['intact']}")
        return res
    finally:
        for name in reversed(undo):
            try:
                cu.process(name, pid)
            except Exception as exc:  # noqa: BLE001 -- cleanup goes on to the kill
                log(f"cleanup {name}: {error_text(exc)}")
                break
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log(f"child {pid} did not exit after SIGKILL")


# ---------------------------------------------------------------- 4. reference engine reload

def bench_engine_reload(_sizes, scratch, reps, layers=ENGINE_LAYERS, hidden=ENGINE_HIDDEN):
    import torch
    from safetensors.torch import load_file
    sys.path.insert(0, str(ENGINE_DIR))  # torch_model.py needs only torch; no vllm stand-in, no allocator
    from torch_model import load_torch_model
    path, res = Path(scratch, "engine.safetensors"), {}
    model = load_torch_model(types.SimpleNamespace(layers=layers, hidden=hidden, seed=1, dtype="bfloat16"))
    model.load()  # as the worker does: packs qkv_t, which is not in the state dict
    try:
        saved, owners, shared = {}, {}, []
        for name, t in model.state_dict().items():  # detached views of the live tensors
            key = (t.device, t.untyped_storage().data_ptr())
            if key in owners:  # safetensors refuses shared storage; the owner restores it
                shared.append(name)
                continue
            owners[key] = name
            saved[name] = t.contiguous()
        nbytes = sum(t.numel() * t.element_size() for t in saved.values())
        post = sum(l.qkv_t.numel() * l.qkv_t.element_size() for l in model.layers if getattr(l, "qkv_t", None) is not None)
        res.update(layers=layers, hidden=hidden, tensors=len(saved), bytes=nbytes, postLoadBytes=post, sharedSkipped=shared)
        log(f"engine: {len(saved)} tensors, {nbytes / GiB:.2f} GiB state dict, {post / GiB:.2f} GiB post-load")
        originals = {k: t.clone() for k, t in saved.items()}  # compared exactly after the reload
        res.update(timed_save(saved, path, nbytes))
        del saved
        live = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        targets = {k: live[k] for k in originals}  # KeyError here = a state-dict name that is not a live tensor

        def reload():
            with torch.no_grad():
                for t in targets.values():
                    t.data.zero_()  # the reload must really put the weights back
            sync()
            t0 = time.perf_counter()
            loaded = load_file(path, device="cuda")
            with torch.no_grad():
                for k, t in loaded.items():
                    targets[k].data.copy_(t)
            sync()
            seconds = time.perf_counter() - t0
            del loaded
            gc.collect()
            return seconds

        cold_then_warm(res, "reload", reload, nbytes, reps)
        res["verified"] = all(torch.equal(targets[k], originals[k]) for k in originals)
        repack, _ = timed(model.load)  # what a reload must redo for tensors outside the state dict
        res.update(repackSeconds=round(repack, 4), verifyNote="torch.equal against GPU copies taken before saving")
        log(f"engine warm reload {res['reloadWarmSeconds']['min']} s, repack {repack:.3f} s, verified {res['verified']}")
        return res
    finally:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- output

SECTIONS = {"safetensors": ("safetensors", bench_safetensors), "torch_copy": ("torchCopy", bench_torch_copy),
            "checkpoint": ("checkpoint", bench_checkpoint), "engine_reload": ("engineReload", bench_engine_reload)}

ROWS = {  # section -> (label, seconds key, GB/s key)
    "safetensors": [("safetensors save_file from cuda", "saveSeconds", "saveGBps"),
                    ("safetensors save_file from cuda + os.sync", "saveSyncedSeconds", "saveSyncedGBps"),
                    ("safetensors load_file to cuda, cold", "loadColdSeconds", "loadColdGBps"),
                    ("safetensors load_file to cuda, warm, best of {reps}", "loadWarmSeconds", "loadWarmGBps")],
    "torchCopy": [("torch pinned allocation (pin_memory=True)", "pinSeconds", "pinGBps"),
                  ("torch copy_ H2D from pinned, best of {reps}", "h2dSeconds", "h2dGBps"),
                  ("torch copy_ D2H to pinned, best of {reps}", "d2hSeconds", "d2hGBps"),
                  ("torch copy_ H2D from pageable", "pageableH2dSeconds", "pageableH2dGBps")],
    "checkpoint": [("cuCheckpointProcess lock + checkpoint", "checkpointSeconds", "checkpointGBps"),
                   ("cuCheckpointProcess restore + unlock", "restoreSeconds", "restoreGBps")],
    "engineReload": [("engine state_dict save_file + os.sync ({size})", "saveSyncedSeconds", "saveSyncedGBps"),
                     ("engine reload (load_file + copy_), cold ({size})", "reloadColdSeconds", "reloadColdGBps"),
                     ("engine reload (load_file + copy_), warm, best of {reps} ({size})", "reloadWarmSeconds", "reloadWarmGBps"),
                     ("engine re-pack after reload (post-load tensors)", "repackSeconds", None)],
}


def markdown(result):
    def cell(value):
        if isinstance(value, dict):
            value = value.get("min", value.get("max"))
        return f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"

    lines = [f"| peer (same {result['gib']:g} GiB) | seconds | GB/s |", "|---|---:|---:|"]
    for section, rows in ROWS.items():
        data = result.get(section) or {}
        if "error" in data or "skipped" in data:
            what = f"error: {data['error']}" if "error" in data else f"skipped: {data['skipped']}"
            lines.append(f"| {section}: {what.replace('|', '/')} | | |")
            continue
        check = data.get("verified", data.get("intact"))
        size = f"{data['bytes'] / GiB:.2f} GiB state dict" if "bytes" in data else ""
        for label, skey, gkey in rows:
            label = label.format(reps=result["reps"], size=size)
            if check is False and ("load_file" in label or "restore" in label):
                label += " (NOT VERIFIED)"  # the bytes came back wrong: the speed means nothing
            lines.append(f"| {label} | {cell(data.get(skey))} | {cell(data.get(gkey)) if gkey else ''} |")
    return "\n".join(lines) + "\n"


def machine_facts(dry_run):
    facts = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if dry_run:
        return {**facts, "torch": None, "gpu": None, "safetensorsVersion": None}
    try:
        import safetensors
        import torch
        facts.update(torch=torch.__version__, cudaRuntime=torch.version.cuda, gpu=torch.cuda.get_device_name(0),
                     safetensorsVersion=getattr(safetensors, "__version__", None))
        driver = nvidia_smi("-i", "0", "--query-gpu=driver_version", "--format=csv,noheader")
        facts["driver"] = driver.strip() if driver else None
    except Exception as exc:  # noqa: BLE001 -- the sections will report their own failures
        facts["factsError"] = error_text(exc)
    return facts


def parse_args(argv):
    p = argparse.ArgumentParser(description="Measure vsnap's peers (safetensors, torch copies, CUDA checkpoint, engine reload)")
    p.add_argument("--gib", type=float, default=16, help="total bytes, GiB (as in the vsnap bench)")
    p.add_argument("--out", required=True, help="JSON result path; the markdown table goes next to it (.md)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    p.add_argument("--dry-run", action="store_true", help="no torch/CUDA: sizes and output files only")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.skip - SECTIONS.keys():
        p.error(f"unknown --skip {','.join(sorted(args.skip - SECTIONS.keys()))}; known: {','.join(SECTIONS)}")
    if args.reps < 1:
        p.error("--reps must be >= 1")
    args.total = int(round(args.gib * GiB))
    if args.total < 2 * GiB + 4 * MiB:
        p.error("--gib must cover the 2 GiB + 4 MiB of fixed regions")
    return args


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cleanup below still runs
    sizes = region_sizes(args.total)
    gib = int(args.gib) if args.gib == int(args.gib) else args.gib
    result = {**machine_facts(args.dry_run), "gib": gib, "bytes": sum(sizes), "regions": len(sizes), "reps": args.reps}
    log(f"{len(sizes)} regions, {sum(sizes) / GiB:.2f} GiB{' (dry run)' if args.dry_run else ''}")
    with tempfile.TemporaryDirectory(prefix="vsnap-peers-") as scratch:
        for name, (key, run) in SECTIONS.items():
            if args.dry_run or name in args.skip:
                result[key] = {"skipped": "dry run" if args.dry_run else "--skip"}
                continue
            log(f"section {name}")
            try:
                result[key] = run(sizes, scratch, args.reps)
            except Exception as exc:  # noqa: BLE001 -- one failed peer must not lose the others
                result[key] = {"error": error_text(exc)}
                log(f"section {name} failed: {result[key]['error']}")
            finally:
                try:
                    free_memory()
                except Exception as exc:  # noqa: BLE001
                    log(f"freeing memory after {name}: {error_text(exc)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    out.write_text(text + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(text)
    log(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
