#!/usr/bin/env python3
"""Where the ENGINE side of a swap spends its time (issue 14): starts one reference engine
(test/fixtures/engine/serve.py; with VSNAP_VLLM_SRC=<folder> and --device cuda, vLLM's real
allocator code, built as test/gpu/vllm-allocator.sh builds it) with VSNAP_PROFILE set, drives it
through the plugin's /vsnap/v1 routes in the order the SDK does (src/snapshot/engine-flows.ts),
and merges the JSON lines every process wrote (engines/vllm/vsnap_vllm/profile.py,
test/fixtures/engine/vllm/_profile.py) into a per-step table, medians over the reps.

    VSNAP_VLLM_SRC=vllm-src python3 bench/engine-profile.py --out "$OUT"
    python3 bench/engine-profile.py --device host --layers 4 --out /tmp/p   # CPU, host memory

Cycles per rep (one engine), in this order: "tier0" = export (the descriptors held, as tier 0
holds them), sleep level 2, wake weights with adopt (mapped back), wake kv_cache, reset prefix
cache, check cold (first request after the wake; must give the recorded answer), check warm;
"release" = release_kv_cache (vLLM's weight-resident suspend), wake kv_cache, reset, check;
"ram" = status, digest (the dirty check in the workers), check, sleep level 2, wake weights, export (the descriptors are received and
closed: no hydrate, so its cold check reads unrestored memory), wake kv_cache, reset, check cold,
check warm; then, unmeasured, reload_weights (--load-seconds 0) and one more tier-0 cycle.
With --variants freeze,nofreeze (default) it runs the whole thing twice: with the engine's GC heap
frozen after warm-up as vLLM does (VSNAP_REF_GC_FREEZE=1), and without (=0, as the reference
engine ran before), so the gc.collect the allocator calls in every sleep and wake shows.
Writes <out>/engine-profile-<variant>.json (raw ops and records) and <out>/engine-profile.md."""

import argparse
import json
import os
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURE = os.path.join(ROOT, "test", "fixtures", "engine")
sys.path.insert(0, os.path.join(ROOT, "engines", "vllm"))

from vsnap_vllm.fdsend import FDS_PER_BATCH, _recv_exact, _recv_fds  # noqa: E402 - the plugin's side of the same protocol
DIGEST_CHUNK = 64 << 20  # the SDK's default chunk size (src/transfer/staging.ts DEFAULT_CHUNK_SIZE)
PROMPT = "The quick brown fox jumps over the lazy dog. Tell me a story about swapping engines."


# ---------------------------------------------------------------------------- descriptor socket

class FdEndpoint:
    """The SDK's side of the descriptor protocol (engines/vllm/vsnap_vllm/fdsend.py): receives
    what export sends, and offers held descriptors to adopt. One connection per call."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "fd.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.result = None

    def serve_once(self, offer=None):
        """Handles one connection in a thread: with `offer` (header, fds) it offers those, else it
        receives (header, fds) into self.result."""
        self.result = None

        def run():
            conn, _ = self.sock.accept()
            with conn:
                head = _recv_exact(conn, 4 + 64 + 8)
                hlen, count = struct.unpack("<II", head[68:76])
                header = json.loads(_recv_exact(conn, hlen))
                fds = _recv_fds(conn, count)
                if offer is None:
                    body = json.dumps({"ok": True}).encode()
                    conn.sendall(struct.pack("<I", len(body)) + body)
                    self.result = (header, fds)
                    return
                body = json.dumps({"ok": True, "offer": offer[0], "fds": len(offer[1])}).encode()
                conn.sendall(struct.pack("<I", len(body)) + body)
                for start in range(0, len(offer[1]), FDS_PER_BATCH):
                    socket.send_fds(conn, [b"F"], offer[1][start:start + FDS_PER_BATCH])

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self):
        self.sock.close()
        os.unlink(self.path)


# ---------------------------------------------------------------------------- engine

class Engine:
    def __init__(self, args, variant, profile_dir, site):
        self.token = secrets.token_hex(16)
        env = dict(os.environ, PYTHONPATH=site, VLLM_PLUGINS="vsnap", VSNAP_TOKEN=self.token, VSNAP_PROFILE=profile_dir,
                   VSNAP_REF_GC_FREEZE="1" if variant == "freeze" else "0")
        cmd = [sys.executable, os.path.join(FIXTURE, "serve.py"), "--device", args.device, "--port", "0", "--enable-sleep-mode",
               "--layers", str(args.layers), "--hidden", str(args.hidden), "--model", f"vsnap/reference-{args.device}-1",
               "--load-seconds", "0"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.proc.kill()
            raise SystemExit(f"the engine did not start (exit {self.proc.wait()}): {line!r}")
        parts = line.split()
        self.port, self.load_seconds = int(parts[1]), float(parts[2])

    def call(self, method, path, body=None, auth=True):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        req.add_header("content-type", "application/json")
        if auth:
            req.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raise SystemExit(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None

    def check(self):
        r = self.call("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}, auth=False)
        choice = r["choices"][0]
        return [choice.get("text"), (choice.get("logprobs") or {}).get("token_logprobs")]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------- driving

def run_variant(args, variant, work, site):
    profile_dir = os.path.join(work, f"profile-{variant}")
    os.makedirs(profile_dir, exist_ok=True)
    engine = Engine(args, variant, profile_dir, site)
    endpoint = FdEndpoint(work)
    driver = None
    if args.device == "cuda":
        from vsnap_vllm.drivers import CudaDriver

        driver = CudaDriver()
        driver.ensure_context(0)
    ops = []
    try:
        def op(rep, cycle, name, fn):
            wall = time.time_ns()
            t0 = time.perf_counter_ns()
            out = fn()
            ops.append({"rep": rep, "cycle": cycle, "op": name, "wall": wall, "ms": (time.perf_counter_ns() - t0) / 1e6})
            return out

        def export(hold):
            nonce = secrets.token_hex(32)
            thread = endpoint.serve_once()
            engine.call("POST", "/vsnap/v1/export", {"socket": endpoint.path, "nonces": [nonce]})
            thread.join(60)
            header, fds = endpoint.result
            if hold:
                # as the SDK's tier 0 (src/cache/resident-weights.ts): an imported handle and the
                # descriptor keep each region alive through the engine's sleep
                handles = [driver.import_fd(fd) for fd in fds] if driver is not None else []
                return header, fds, handles
            for fd in fds:
                os.close(fd)
            return header, [], []

        def adopt_wake(held):
            header, fds, handles = held
            thread = endpoint.serve_once(({"regions": [{"va": r["va"], "size": r["size"]} for r in header["regions"]]}, fds))
            try:
                engine.call("POST", "/vsnap/v1/wake", {"tags": ["weights"], "adopt": {"socket": endpoint.path, "nonces": [secrets.token_hex(32)]}})
                thread.join(60)
            finally:
                for fd in fds:  # the engine imported them: its handles keep the memory
                    os.close(fd)
                for h in handles:
                    driver.release(0, h)

        expected = engine.check()
        engine.check()  # warm-up
        mismatches = [0]

        def ram(rep):
            c = "ram"
            status = op(rep, c, "status", lambda: engine.call("GET", "/vsnap/v1/status"))
            if all(r.get("digest") for r in status["ranks"]):  # a worker without numpy on host memory cannot
                op(rep, c, "digest (dirty check)", lambda: engine.call("POST", "/vsnap/v1/digest", {"chunkSize": DIGEST_CHUNK}))
            op(rep, c, "check (suspend)", engine.check)
            op(rep, c, "sleep level 2", lambda: engine.call("POST", "/vsnap/v1/sleep", {"level": 2}))
            op(rep, c, "wake weights", lambda: engine.call("POST", "/vsnap/v1/wake", {"tags": ["weights"]}))
            op(rep, c, "export", lambda: export(False))
            op(rep, c, "wake kv_cache", lambda: engine.call("POST", "/vsnap/v1/wake", {"tags": ["kv_cache"]}))
            op(rep, c, "reset prefix cache", lambda: engine.call("POST", "/vsnap/v1/reset_prefix_cache"))
            op(rep, c, "check cold", engine.check)
            op(rep, c, "check warm", engine.check)

        def tier0(rep):
            c = "tier0"
            held = op(rep, c, "export (hold)", lambda: export(True))
            op(rep, c, "sleep level 2", lambda: engine.call("POST", "/vsnap/v1/sleep", {"level": 2}))
            op(rep, c, "wake weights + adopt", lambda: adopt_wake(held))
            op(rep, c, "wake kv_cache", lambda: engine.call("POST", "/vsnap/v1/wake", {"tags": ["kv_cache"]}))
            op(rep, c, "reset prefix cache", lambda: engine.call("POST", "/vsnap/v1/reset_prefix_cache"))
            mismatches[0] += op(rep, c, "check cold", engine.check) != expected
            op(rep, c, "check warm", engine.check)

        def release(rep):
            c = "release"
            op(rep, c, "release kv_cache", lambda: engine.call("POST", "/vsnap/v1/release_kv_cache"))
            op(rep, c, "wake kv_cache", lambda: engine.call("POST", "/vsnap/v1/wake", {"tags": ["kv_cache"]}))
            op(rep, c, "reset prefix cache", lambda: engine.call("POST", "/vsnap/v1/reset_prefix_cache"))
            op(rep, c, "check cold", engine.check)

        for rep in range(-1, args.reps):  # rep -1: unmeasured warm-up of every path
            tier0(rep)
            release(rep)
            ram(rep)
            # The ram cycle hydrated nothing: the model source brings the weights back, and an
            # unmeasured tier-0 cycle puts the memory the reload left cached through the next sleep.
            op(-2, "ram", "reload weights", lambda: engine.call("POST", "/vsnap/v1/reload_weights"))
            tier0(-2)
        mismatches = mismatches[0]
        status = engine.call("GET", "/vsnap/v1/status")
    finally:
        engine.stop()
        endpoint.close()
    records = []
    for name in sorted(os.listdir(profile_dir)):
        with open(os.path.join(profile_dir, name)) as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return {"variant": variant, "loadSeconds": engine.load_seconds, "ops": ops, "records": records, "tier0Mismatches": mismatches,
            "regions": [r.get("regions") for r in status.get("ranks", [])], "bytes": [r.get("bytes") for r in status.get("ranks", [])],
            "processBytes": [r.get("processBytes") for r in status.get("ranks", [])]}


# ---------------------------------------------------------------------------- merging

def merge(result):
    """Per (cycle, op): the client's time and, per step, the time summed over the step's records
    that started inside the op's window and their count; medians over the measured reps."""
    ops = [o for o in result["ops"] if o["rep"] >= 0]
    records = sorted(result["records"], key=lambda r: r["wall"])
    rows = {}
    for o in ops:
        end = o["wall"] + int(o["ms"] * 1e6)
        steps = {}
        for r in records:
            if o["wall"] <= r["wall"] <= end:
                s = steps.setdefault(r["step"], [0.0, 0])
                s[0] += (r["end"] - r["start"]) / 1e6
                s[1] += 1
        key = (o["cycle"], o["op"])
        row = rows.setdefault(key, {"ms": [], "steps": {}})
        row["ms"].append(o["ms"])
        for step, (ms, n) in steps.items():
            row["steps"].setdefault(step, []).append((ms, n))
    out = []
    for (cycle, name), row in rows.items():
        reps = len(row["ms"])
        steps = []
        for step, vals in row["steps"].items():
            ms = [v[0] for v in vals] + [0.0] * (reps - len(vals))
            steps.append({"step": step, "ms": statistics.median(ms), "count": statistics.median([v[1] for v in vals])})
        steps.sort(key=lambda s: _layer(s["step"]))
        out.append({"cycle": cycle, "op": name, "ms": statistics.median(row["ms"]), "steps": steps})
    return out


LAYERS = ["http", "vsnap.route", "vsnap.client", "client", "core", "core.rpc", "worker.rpc", "vsnap", "worker", "vsnap.hook", "alloc"]


def _layer(step):
    head = step.split(" ", 1)[0]
    return (LAYERS.index(head) if head in LAYERS else len(LAYERS), step)


def _sum(steps, pred):
    hit = [s for s in steps if pred(s["step"])]
    return sum(s["ms"] for s in hit), sum(s["count"] for s in hit)


SUMMARY = [
    ("HTTP server", lambda n: n.startswith("http ")),
    ("engine core", lambda n: n.startswith("core ") and not n.startswith("core.rpc")),
    ("worker calls", lambda n: n.startswith("core.rpc ") or n.startswith("worker.rpc ")),
    ("vsnap worker methods", lambda n: n in ("vsnap export", "vsnap adopt", "vsnap status", "vsnap digest")),
    ("alloc create_and_map", lambda n: n == "alloc create_and_map"),
    ("alloc unmap_and_release", lambda n: n == "alloc unmap_and_release"),
    ("vsnap hooks", lambda n: n.startswith("vsnap.hook ")),
    ("gc.collect", lambda n: n == "alloc gc.collect"),
    ("empty_cache", lambda n: n.endswith(".empty_cache")),
    ("forward pass", lambda n: n in ("worker generate", "worker ref_logits")),
]


def summary(result):
    """One line per operation: where its client time went, by layer (ms, medians; n = calls)."""
    lines = ["| cycle | op | client | " + " | ".join(name for name, _ in SUMMARY) + " |", "|---|---|---:|" + "---:|" * len(SUMMARY)]
    for row in merge(result):
        cells = []
        for _name, pred in SUMMARY:
            ms, n = _sum(row["steps"], pred)
            cells.append("" if n == 0 else f"{ms:.1f}" + (f" ({n:g})" if n > 1 else ""))
        lines.append(f"| {row['cycle']} | {row['op']} | {row['ms']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(result):
    lines = [f"### variant {result['variant']} (GC heap {'frozen after warm-up, as vLLM does' if result['variant'] == 'freeze' else 'not frozen'})", "",
             f"regions per rank {result['regions']}, bytes {result['bytes']}, processBytes {result['processBytes']}; "
             f"tier-0 checks that differed from the recorded answer: {result['tier0Mismatches']}", "",
             summary(result), "",
             "| cycle | op (client ms, median) | step | count | ms (median, summed) |", "|---|---|---|---:|---:|"]
    for row in merge(result):
        lines.append(f"| {row['cycle']} | **{row['op']}** | (client, incl. HTTP) | | {row['ms']:.1f} |")
        for s in row["steps"]:
            lines.append(f"| | | {s['step']} | {s['count']:g} | {s['ms']:.2f} |")
    return "\n".join(lines)


def build_reference_allocator(work):
    """As test/gpu/run.sh: the reference engine's own CUDA allocator (test/fixtures/engine/csrc)."""
    cuda = os.environ.get("CUDA_PATH", "/usr/local/cuda")
    lib = os.path.join(work, "libvsnap_ref_cumem.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{cuda}/include", os.path.join(FIXTURE, "csrc", "cumem_allocator.c"), "-o", lib, "-ldl"], check=True)
    os.environ["VSNAP_REF_CUMEM_LIB"] = lib


def build_allocator(src):
    """As test/gpu/vllm-allocator.sh: checks the folder and builds vLLM's C extension."""
    subprocess.run(["bash", "-c", ". test/gpu/vllm-allocator.sh"], cwd=ROOT, check=True, env=dict(os.environ, VSNAP_VLLM_SRC=src))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "host"], default="cuda")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variants", default="freeze,nofreeze")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    src = os.environ.get("VSNAP_VLLM_SRC")
    if src and args.device == "cuda":
        os.environ["VSNAP_VLLM_SRC"] = os.path.abspath(src)
        build_allocator(os.environ["VSNAP_VLLM_SRC"])
    sys.path.insert(0, FIXTURE)
    from plugin_site import make_plugin_site

    report = [f"# engine profile ({args.device}, {args.layers} layers, hidden {args.hidden}, "
              f"allocator: {'vLLM ' + os.environ['VSNAP_VLLM_SRC'] if src and args.device == 'cuda' else 'reference stand-in'}, {args.reps} reps)", ""]
    with tempfile.TemporaryDirectory(prefix="vsnap-engprof-") as work:
        site = make_plugin_site(os.path.join(work, "site"))
        if args.device == "cuda" and not src and not os.environ.get("VSNAP_REF_CUMEM_LIB"):
            build_reference_allocator(work)
        for variant in args.variants.split(","):
            result = run_variant(args, variant, work, site)
            with open(os.path.join(args.out, f"engine-profile-{variant}.json"), "w") as f:
                json.dump({**result, "merged": merge(result)}, f)
            text = table(result)
            print(text + "\n", flush=True)
            report += [text, ""]
    with open(os.path.join(args.out, "engine-profile.md"), "w") as f:
        f.write("\n".join(report))


if __name__ == "__main__":
    main()
