"""Does the CUDA process checkpoint API work on processes holding an NCCL communicator? (issue 15)

Two worker processes (one per GPU) join an NCCL communicator, allocate a buffer and all-reduce;
this controller (another process, as vsnap's SDK is) then locks, checkpoints, restores (in place
or with the GPUs swapped) and unlocks both through the driver, and the workers all-reduce again.
Each scenario runs in fresh workers; every wait has a deadline; the workers are always killed.

  default        torch ProcessGroupNCCL, NCCL's defaults (P2P/CUMEM/NVLS as NCCL picks them)
  socket         vLLM ProcessCheckpointExecutor's Socket-only settings (P2P, SHM, IB, CUMEM off)
  p2p            vLLM's suspend settings (P2P and CUMEM on, NVLS, SHM, IB off) but no ncclCommSuspend
  suspend        vLLM's settings with --enable-nccl-comm-suspend: a raw NCCL communicator (as
                 vLLM's PyNccl builds one) with CUMEM on, NVLS off, ncclCommSuspend(NCCL_SUSPEND_MEM)
                 before the lock and ncclCommResume after the unlock (NCCL 2.29.7+, else skipped)
  remap-*        the same, restored with GPUs 0 and 1 swapped (the whole permutation in gpuPairs)
vLLM's settings: vllm/v1/executor/process_checkpoint_executor.py (ProcessCheckpointExecutor.__init__)
and docs/features/sleep_mode.md. Driver calls run in a helper process (as vllm/utils/
cuda_process_checkpoint.py does) so that a call that hangs can be killed; neither the helper nor
this controller creates a CUDA context.

Usage: python3 bench/nccl-checkpoint.py --out DIR [--scenarios default,socket,...] [--mib 256]
       [--budget 220] [--dry-run]      (writes DIR/nccl-checkpoint.json and .md)"""

import argparse
import collections
import ctypes as C
import datetime
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

SOCKET_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_CUMEM_ENABLE": "0",
              "NCCL_CUMEM_HOST_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
SUSPEND_ENV = {"NCCL_P2P_DISABLE": "0", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_CUMEM_ENABLE": "1",
               "NCCL_CUMEM_HOST_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
SCENARIOS = {  # name: (environment, communicator, ncclCommSuspend around the checkpoint, swap GPUs 0 and 1)
    "default": ({}, "torch", False, False),
    "socket": (SOCKET_ENV, "torch", False, False),
    "p2p": (SUSPEND_ENV, "torch", False, False),
    "suspend": (SUSPEND_ENV, "raw", True, False),
    "remap-socket": (SOCKET_ENV, "torch", False, True),
    "remap-suspend": (SUSPEND_ENV, "raw", True, True),
    "remap-default": ({}, "torch", False, True),
}
NCCL_KEYS = sorted(set(SOCKET_ENV) | {"NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG"})
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
T_START, T_DRIVER, T_COLLECTIVE, LOCK_MS = 120, 30, 30, 10000


def log(msg):
    print(f"nccl-checkpoint: {msg}", file=sys.stderr, flush=True)


# ---- the driver's checkpoint structs (cuda.h, CUDA 13.0) --------------------------------------
class LockArgs(C.Structure):
    _fields_ = [("timeoutMs", C.c_uint), ("reserved0", C.c_uint), ("reserved1", C.c_uint64 * 7)]


class Reserved8(C.Structure):  # CUcheckpointCheckpointArgs and CUcheckpointUnlockArgs
    _fields_ = [("reserved", C.c_uint64 * 8)]


class Uuid(C.Structure):
    _fields_ = [("bytes", C.c_ubyte * 16)]


class GpuPair(C.Structure):
    _fields_ = [("oldUuid", Uuid), ("newUuid", Uuid)]


class RestoreArgs(C.Structure):  # pointer, count, char reserved[52 - sizeof(pointer)], uint64 reserved1
    _fields_ = [("gpuPairs", C.POINTER(GpuPair)), ("gpuPairsCount", C.c_uint), ("reserved", C.c_char * 44),
                ("reserved1", C.c_uint64)]


def check_layout():
    sizes = {"LockArgs": C.sizeof(LockArgs), "CheckpointArgs": C.sizeof(Reserved8), "GpuPair": C.sizeof(GpuPair),
             "RestoreArgs": C.sizeof(RestoreArgs), "RestoreArgs.reserved1": RestoreArgs.reserved1.offset}
    want = {"LockArgs": 64, "CheckpointArgs": 64, "GpuPair": 32, "RestoreArgs": 64, "RestoreArgs.reserved1": 56}
    assert sizes == want, f"struct layout {sizes} != cuda.h's {want}"
    return sizes


def swap_pairs(uuids):
    """Every GPU in the pairs (a lone 0->1 is refused on a machine of several GPUs): 0<->1, others onto themselves."""
    order = list(range(len(uuids)))
    order[0], order[1] = 1, 0
    return [[uuids[i], uuids[order[i]]] for i in range(len(uuids))]


# ---- driver helper: one process per scenario, JSON lines in and out ---------------------------
def driver_main():
    C.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the controller
    cu = C.CDLL("libcuda.so.1")

    def err(rc):
        name = C.c_char_p()
        cu.cuGetErrorName(rc, C.byref(name))
        return name.value.decode() if name.value else f"CUresult {rc}"

    def out(**kw):
        print(json.dumps(kw), flush=True)
    rc = cu.cuInit(0)
    if rc:
        return out(ok=False, error=f"cuInit: {err(rc)}")
    ver, n = C.c_int(), C.c_int()
    cu.cuDriverGetVersion(C.byref(ver))
    cu.cuDeviceGetCount(C.byref(n))
    uuids = []
    for i in range(n.value):
        d, u = C.c_int(), Uuid()
        cu.cuDeviceGet(C.byref(d), i)
        cu.cuDeviceGetUuid_v2(C.byref(u), d)
        uuids.append(bytes(u.bytes).hex())
    has = all(hasattr(cu, "cuCheckpointProcess" + op) for op in ("Lock", "Checkpoint", "Restore", "Unlock", "GetState"))
    out(ok=True, driverVersion=ver.value, uuids=uuids, checkpointApi=has)
    for line in sys.stdin:
        op, pid, extra = json.loads(line)
        if op == "state":
            s = C.c_int(-1)
            rc = cu.cuCheckpointProcessGetState(pid, C.byref(s))
            out(rc=rc, error=err(rc) if rc else None, state=STATES.get(s.value, s.value), ms=0)
            continue
        if op == "lock":
            args = LockArgs(timeoutMs=extra)
        elif op == "restore":
            args = RestoreArgs()  # zeroed: no pairs restores the process onto its own GPUs
            pairs = (GpuPair * len(extra or []))()  # kept alive in this scope during the call
            for p, (old, new) in zip(pairs, extra or []):
                p.oldUuid.bytes[:], p.newUuid.bytes[:] = bytes.fromhex(old), bytes.fromhex(new)
            if extra:
                args.gpuPairs, args.gpuPairsCount = C.cast(pairs, C.POINTER(GpuPair)), len(extra)
        else:
            args = Reserved8()
        fn = getattr(cu, "cuCheckpointProcess" + op.capitalize())
        t = time.perf_counter()
        rc = fn(C.c_int(pid), C.byref(args))
        ms = (time.perf_counter() - t) * 1e3
        s = C.c_int(-1)
        cu.cuCheckpointProcessGetState(pid, C.byref(s))
        out(rc=rc, error=err(rc) if rc else None, state=STATES.get(s.value, s.value), ms=round(ms, 2))


# ---- worker: one rank, commands on stdin, "@@{json}" results on stdout ------------------------
def worker_main(rank, world, port, comm_kind, mib):
    C.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the controller
    import datetime as dt
    import torch
    import torch.distributed as dist
    say = lambda **kw: print("@@" + json.dumps(kw), flush=True)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    cu = C.CDLL("libcuda.so.1")

    def where():  # the physical GPU under this process's context now (after a remap it changes)
        d, u = C.c_int(-1), Uuid()
        cu.cuCtxGetDevice(C.byref(d))
        cu.cuDeviceGetUuid_v2(C.byref(u), d)
        return bytes(u.bytes).hex()

    init = f"tcp://127.0.0.1:{port}"
    info = {"torch": torch.__version__, "ncclTorch": ".".join(map(str, torch.cuda.nccl.version())),
            "env": {k: os.environ[k] for k in NCCL_KEYS if k in os.environ}}
    nccl = comm = None

    def ok(r, what):
        if r:
            raise RuntimeError(f"{what}: ncclResult {r} ({nccl.ncclGetErrorString(r).decode()})")
    if comm_kind == "torch":
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world,
                                timeout=dt.timedelta(seconds=60), device_id=dev)
        pg = dist.distributed_c10d._get_default_group()._get_backend(dev)
        info["torchSuspendApi"] = [a for a in dir(pg) if "suspend" in a.lower() or "resume" in a.lower()]
        allreduce = lambda x: dist.all_reduce(x)
    else:  # a raw NCCL communicator on torch's libnccl, built as vLLM's PyNccl builds one; gloo only bootstraps
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=dt.timedelta(seconds=60))
        maps = [l.split()[-1] for l in open("/proc/self/maps") if "/libnccl.so" in l]
        nccl = C.CDLL(maps[0] if maps else "libnccl.so.2")
        info["ncclPath"] = maps[0] if maps else "libnccl.so.2"
        v = C.c_int()
        nccl.ncclGetVersion(C.byref(v))
        info["ncclRaw"] = v.value
        info["ncclCommSuspend"] = hasattr(nccl, "ncclCommSuspend") and hasattr(nccl, "ncclCommResume")

        class UniqueId(C.Structure):
            _fields_ = [("internal", C.c_byte * 128)]
        uid = UniqueId()
        if rank == 0:
            nccl.ncclGetUniqueId(C.byref(uid))
        box = [bytes(uid.internal)]
        dist.broadcast_object_list(box, src=0)
        C.memmove(uid.internal, box[0], 128)
        comm = C.c_void_p()
        nccl.ncclCommInitRank.argtypes = [C.POINTER(C.c_void_p), C.c_int, UniqueId, C.c_int]
        nccl.ncclGetErrorString.restype = C.c_char_p
        ok(nccl.ncclCommInitRank(C.byref(comm), world, uid, rank), "ncclCommInitRank")
        nccl.ncclAllReduce.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_void_p, C.c_void_p]

        def allreduce(x):  # ncclFloat32 = 7, ncclSum = 0
            ok(nccl.ncclAllReduce(x.data_ptr(), x.data_ptr(), x.numel(), 7, 0, comm,
                                  torch.cuda.current_stream().cuda_stream), "ncclAllReduce")

    n = (mib << 20) // 4
    g = torch.Generator(device=dev)
    g.manual_seed(1234 + rank)
    data = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device=dev, generator=g)
    host = data.cpu()

    def collective():
        x = torch.full(((64 << 20) // 4,), float(rank + 1), device=dev)
        torch.cuda.synchronize()
        t = time.perf_counter()
        allreduce(x)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        want = world * (world + 1) / 2
        return {"ok": bool(torch.all(x == want).item()), "ms": round(ms, 2), "intact": bool(torch.equal(data.cpu(), host)),
                "gpu": where(), "allocatedMiB": torch.cuda.memory_allocated(dev) >> 20}

    say(op="ready", pid=os.getpid(), **info, **collective())
    for line in sys.stdin:
        op = line.strip()
        try:
            if op == "allreduce":
                say(op=op, **collective())
            elif op in ("suspend", "resume"):
                t = time.perf_counter()
                torch.cuda.synchronize()
                r = nccl.ncclCommSuspend(comm, 1) if op == "suspend" else nccl.ncclCommResume(comm)  # NCCL_SUSPEND_MEM
                ok(r, "ncclComm" + op.capitalize())
                say(op=op, ok=True, ms=round((time.perf_counter() - t) * 1e3, 2))
            elif op == "exit":
                break
        except Exception as e:  # reported, the controller decides
            say(op=op, ok=False, error=f"{type(e).__name__}: {e}")
    os._exit(0)  # no destroy_process_group: it may hang after a failed restore


# ---- controller -------------------------------------------------------------------------------
class Line:
    """A child whose stdout carries JSON lines (after `prefix`); read() waits at most `timeout` seconds."""

    def __init__(self, argv, env, stderr, prefix=""):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                                     text=True, bufsize=1)
        self.prefix, self.lines, self.other = prefix, queue.Queue(), collections.deque(maxlen=40)
        threading.Thread(target=self._pump, daemon=True).start()  # a thread: select() misses buffered lines

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith(self.prefix):
                self.lines.put(line[len(self.prefix):])
            else:
                self.other.append(line.rstrip())  # NCCL_DEBUG writes to stdout
        self.lines.put(None)

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def read(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer in {timeout} s") from None
        if line is None:
            self.lines.put(None)
            raise RuntimeError(f"exited (rc {self.proc.wait(5)})")
        return json.loads(line)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            return "unkillable"
        return None


def smi(query, fields):
    """nvidia-smi's CSV rows (None where nvidia-smi is missing or hangs)."""
    try:
        r = subprocess.run(["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [l.split(", ") for l in r.stdout.strip().splitlines() if l.count(", ") == fields.count(",")]


def smi_memory():
    """MiB used per pid, in all and on each GPU (UUID as 32 hex digits), as nvidia-smi lists them."""
    rows = smi("compute-apps", "pid,gpu_uuid,used_memory")
    if rows is None:
        return None
    out = {}
    for pid, gpu, used in rows:
        if pid.isdigit() and used.isdigit():
            e = out.setdefault(int(pid), {"MiB": 0, "gpus": {}})
            e["MiB"] += int(used)
            e["gpus"][gpu.replace("GPU-", "").replace("-", "").lower()] = int(used)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Failed(Exception):
    pass


def run_scenario(name, args, children):
    env_extra, comm, suspend, remap = SCENARIOS[name]
    res = {"scenario": name, "env": env_extra, "comm": comm, "ncclSuspend": suspend, "remap": remap, "steps": [],
           "memoryMiB": {}, "result": "ok"}
    base = {k: v for k, v in os.environ.items() if k not in NCCL_KEYS and k != "CUDA_VISIBLE_DEVICES"}
    logs = [open(os.path.join(args.out, f"{name}-{r}.log"), "w") for r in range(2)]
    helper = Line([sys.executable, __file__, "--driver"], base, subprocess.DEVNULL)
    port = free_port()
    workers = [Line([sys.executable, __file__, "--worker", str(r), "2", str(port), comm, str(args.mib)],
                    {**base, **env_extra, "NCCL_DEBUG": "WARN"}, logs[r], "@@") for r in range(2)]
    children.extend([helper, *workers])
    pids = []

    def step(label, fn, deadline, ranks=(0, 1)):
        """Run fn(rank) for each rank (sends first, then reads: collectives need every rank), record it."""
        t = time.perf_counter()
        sends = [fn(r) for r in ranks]
        try:
            outs = [read(deadline) for read in sends]
        except (TimeoutError, RuntimeError) as e:
            res["steps"].append({"step": label, "error": str(e), "ms": round((time.perf_counter() - t) * 1e3, 1)})
            res["result"] = "hung" if isinstance(e, TimeoutError) else "failed"
            raise Failed(f"{label}: {e}")
        res["steps"].append({"step": label, "ms": round((time.perf_counter() - t) * 1e3, 1), "ranks": outs})
        bad = [f"rank {r}: {o.get('error')}" + (f" (state {o['state']})" if "state" in o else "")
               for r, o in zip(ranks, outs) if o.get("rc") or o.get("ok") is False]
        if bad:
            res["result"] = "failed"
            raise Failed(f"{label}: {'; '.join(bad)}")
        return outs

    def to_worker(op):
        return lambda r: (workers[r].send(op), workers[r].read)[1]

    def to_driver(op, extra=None):
        def call(r):  # the helper makes one call at a time, in order: the read waits for this one
            helper.send(json.dumps([op, pids[r], extra]))
            return lambda timeout: helper.read(timeout)
        return call

    try:
        hello = helper.read(T_DRIVER)
        res["driver"] = hello
        if not hello.get("checkpointApi"):
            res["result"] = "skipped"
            raise Failed(f"driver: {hello}")
        ready = step("start+allreduce", lambda r: workers[r].read, T_START)
        pids[:] = [o["pid"] for o in ready]
        res["workers"] = ready
        if not all(o["ok"] and o["intact"] for o in ready):
            res["result"] = "failed"
            raise Failed("first all_reduce gave a wrong result")
        if suspend and not ready[0].get("ncclCommSuspend"):
            res["result"] = "skipped"
            raise Failed(f"libnccl {ready[0].get('ncclRaw')} lacks ncclCommSuspend/ncclCommResume (NCCL 2.29.7+)")
        res["memoryMiB"]["awake"] = smi_memory()
        if suspend:
            step("ncclCommSuspend", to_worker("suspend"), T_COLLECTIVE)
            res["memoryMiB"]["suspended"] = smi_memory()
        step("lock", to_driver("lock", LOCK_MS), T_DRIVER)
        step("checkpoint", to_driver("checkpoint"), T_DRIVER)
        res["memoryMiB"]["checkpointed"] = smi_memory()
        pairs = swap_pairs(hello["uuids"]) if remap else None
        if remap and len(hello["uuids"]) < 2:
            res["result"] = "skipped"
            raise Failed("remap needs two GPUs")
        res["gpuPairs"] = pairs
        step("restore", to_driver("restore", pairs), T_DRIVER)
        step("unlock", to_driver("unlock"), T_DRIVER)
        res["memoryMiB"]["restored"] = smi_memory()
        if suspend:
            step("ncclCommResume", to_worker("resume"), T_COLLECTIVE)
        after = step("allreduce", to_worker("allreduce"), T_COLLECTIVE)
        res["moved"] = [ready[r]["gpu"] != after[r]["gpu"] for r in range(2)]  # the worker's own view
        awake, restored = res["memoryMiB"]["awake"], res["memoryMiB"]["restored"]
        if awake is not None and restored is not None:  # nvidia-smi's view: the GPUs each pid is on
            res["smiGpus"] = [[sorted(m.get(p, {}).get("gpus", {})) for p in pids] for m in (awake, restored)]
        if not all(o["ok"] and o["intact"] for o in after):
            res["result"] = "failed"
            res["error"] = "all_reduce after restore gave a wrong result, or the buffer changed"
    except Failed as e:
        res["error"] = str(e)
        log(f"{name}: {e}")
    except Exception as e:  # the controller's own fault: still report and clean up
        res["result"], res["error"] = "failed", f"{type(e).__name__}: {e}"
    finally:
        if res["result"] != "ok" and pids:
            helper.kill()  # it may be stuck in a driver call: ask a fresh one what state each worker is in
            helper = Line([sys.executable, __file__, "--driver"], base, subprocess.DEVNULL)
            children.append(helper)
            try:
                helper.read(T_DRIVER)
                res["finalStates"] = [to_driver("state")(r)(5)["state"] for r in range(len(pids))]
            except Exception as e:
                res["finalStates"] = f"unreadable: {e}"
        for w in workers:
            if w.proc.poll() is None:
                try:
                    w.send("exit")
                except OSError:
                    pass
        time.sleep(0.5)
        res["unkillable"] = [pids[i] for i, w in enumerate(workers) if w.kill()] if pids else []
        helper.kill()
        for c in [c for c in children if c is helper or c in workers or c.proc.poll() is not None]:
            children.remove(c)
        for f in logs:
            f.close()
        if res["result"] != "ok":  # the workers' last words: their stderr and NCCL's lines on stdout
            res["stderrTail"] = [open(f.name).read()[-1500:] for f in logs]
            res["stdoutTail"] = [list(w.other)[-15:] for w in workers]
    return res


def markdown(report):
    rows = ["| scenario | result | lock ms | checkpoint ms | MiB awake -> checkpointed | restore ms | unlock ms | all_reduce after | notes |",
            "|---|---|---|---|---|---|---|---|---|"]
    for s in report["scenarios"]:  # driver times per rank (rank 0/rank 1), else the step's wall time
        ms = {st["step"]: "/".join(str(o.get("ms")) for o in st["ranks"]) if "ranks" in st else f"({st['ms']})"
              for st in s["steps"]}
        pids = [w["pid"] for w in s.get("workers", [])]

        def mib(phase):  # per worker, as nvidia-smi lists it (a pid it does not list holds 0)
            m = s["memoryMiB"].get(phase)
            return "/".join(str(m.get(p, {}).get("MiB", 0)) for p in pids) if m is not None and pids else "-"
        left_txt = f"{mib('awake')} -> {mib('checkpointed')}"
        ar = next((st for st in s["steps"] if st["step"] == "allreduce" and "ranks" in st), None)
        ar_txt = (f"{'ok' if all(o['ok'] for o in ar['ranks']) else 'WRONG'} {max(o['ms'] for o in ar['ranks'])} ms"
                  if ar else "-")
        note = (s.get("error") or "").replace("|", "/")[:200]
        note += f" final states {s['finalStates']}" if s.get("finalStates") else ""
        note += f" GPU changed {s.get('moved', '-')}" if s.get("remap") or any(s.get("moved") or []) else ""
        rows.append(f"| {s['scenario']} | {s['result']} | {ms.get('lock', '-')} | {ms.get('checkpoint', '-')} | {left_txt} | "
                    f"{ms.get('restore', '-')} | {ms.get('unlock', '-')} | {ar_txt} | {note} |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--mib", type=int, default=256, help="MiB each worker allocates and checks")
    ap.add_argument("--budget", type=float, default=180, help="seconds; scenarios not started by then are skipped")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver:
        return driver_main()
    if a.worker:
        r, w, port, comm, mib = a.worker
        return worker_main(int(r), int(w), int(port), comm, int(mib))
    names = [n for n in a.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}")
    layout = check_layout()
    if a.dry_run:
        print(f"struct layout matches cuda.h: {layout}")
        print(f"gpuPairs for 4 GPUs a,b,c,d: {swap_pairs(['a', 'b', 'c', 'd'])}")
        for n in names:
            env, comm, suspend, remap = SCENARIOS[n]
            print(f"{n}: 2 workers ({comm} communicator, {a.mib} MiB each), env {env or 'NCCL defaults'}; "
                  f"start+all_reduce (<= {T_START} s){', ncclCommSuspend' if suspend else ''}, lock ({LOCK_MS} ms) both, "
                  f"checkpoint both, nvidia-smi, restore both {'with GPUs 0<->1 swapped' if remap else 'in place'}, "
                  f"unlock both{', ncclCommResume' if suspend else ''}, all_reduce + buffer check (<= {T_COLLECTIVE} s); kill")
        print(f"writes {os.path.join(a.out, 'nccl-checkpoint.json')} and .md; scenarios past {a.budget} s are skipped")
        return 0
    os.makedirs(a.out, exist_ok=True)
    children = []

    def stop(signum, _frame):
        for c in children:
            c.kill()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "host": socket.gethostname(), "mib": a.mib, "scenarios": [],
              "gpus": smi("gpu", "index,uuid,name,driver_version,memory.used"), "appsBefore": smi_memory()}
    t0 = time.monotonic()
    try:
        for n in names:
            if time.monotonic() - t0 > a.budget:
                report["scenarios"].append({"scenario": n, "result": "skipped", "error": "time budget spent",
                                            "steps": [], "memoryMiB": {}})
                continue
            log(f"{n} ...")
            s = run_scenario(n, a, children)
            report["scenarios"].append(s)
            log(f"{n}: {s['result']} " + " ".join("%s=%sms" % (x["step"], x["ms"]) for x in s["steps"]))
    finally:
        for c in children:
            c.kill()
        report["seconds"] = round(time.monotonic() - t0, 1)
        with open(os.path.join(a.out, "nccl-checkpoint.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(a.out, "nccl-checkpoint.md"), "w") as f:
            f.write(markdown(report))
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
