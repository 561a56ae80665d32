"""Opt-in step timings (VSNAP_PROFILE=<dir>): every timed step of the bridge, its routes, its hooks
and vLLM's sleep-mode allocator appends one JSON line to <dir>/<pid>.jsonl:
{"pid", "rank", "step", "start", "end", "wall"[, extras]}: start/end are time.perf_counter_ns()
of this process, wall is time.time_ns() at the start (aligns processes on one host). Step names
start with their layer: "vsnap.route" (API server), "vsnap.client" (API server -> engine core),
"vsnap" (worker methods), "vsnap.hook", "alloc" (the allocator, wrapped from outside:
`create_and_map` / `unmap_and_release` per allocation, CuMemAllocator.sleep / wake_up /
discard, and the gc.collect and empty_cache those call). bench/engine-profile.py merges them.

Unset (the default): span() hands back one shared no-op object, nothing is wrapped, nothing is
written."""

import functools
import json
import os
import time

from . import settings

# read once, at import: whether to wrap the allocator is decided once per process
DIR = settings.profile_dir()
RANK = None  # this process's worker rank, once known
_fd = None


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


NULL = _Null()


def enabled():
    return DIR is not None


def _write(line):
    global _fd
    if _fd is None:
        os.makedirs(DIR, exist_ok=True)
        _fd = os.open(os.path.join(DIR, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line)  # one write per line: O_APPEND keeps writers of one file apart


def record(step, start, end, wall, **extra):
    entry = {"pid": os.getpid(), "rank": RANK, "step": step, "start": start, "end": end, "wall": wall, **extra}
    _write((json.dumps(entry, separators=(",", ":")) + "\n").encode())


class _Span:
    __slots__ = ("step", "extra", "start", "wall")

    def __init__(self, step, extra):
        self.step, self.extra = step, extra

    def __enter__(self):
        self.wall, self.start = time.time_ns(), time.perf_counter_ns()
        return self

    def __exit__(self, exc_type, *exc):
        end = time.perf_counter_ns()
        if exc_type is not None:
            self.extra["error"] = exc_type.__name__
        record(self.step, self.start, end, self.wall, **self.extra)
        return False


def span(step, **extra):
    """A context manager timing `step` when profiling, else the shared no-op."""
    return _Span(step, extra) if DIR else NULL


def timed(step, fn):
    """`fn` timed as `step` (a new function), or `fn` itself when not profiling."""
    if not DIR:
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _Span(step, {}):
            return fn(*args, **kwargs)

    call._vsnap_profiled = True
    return call


class _Proxy:
    """A module seen through one attribute module: `overrides` first, the rest from `target`."""

    def __init__(self, target, overrides):
        self._vsnap_target = target
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._vsnap_target, name)


def instrument_allocator(cumem):
    """Wraps, from outside, what vLLM's sleep and wake call in the allocator module `cumem`
    (vllm/device_allocator/cumem.py on vLLM main, or the reference engine's stand-in):
    its module-level create_and_map / unmap_and_release (outermost: the bridge's wrap or hooks
    inside), CuMemAllocator.sleep / wake_up / discard, and the module's `gc` and `torch` globals
    seen through proxies that time gc.collect and torch.cuda / torch.accelerator empty_cache.
    Once per process; nothing when not profiling. Returns whether it wrapped."""
    if not DIR or getattr(cumem, "_vsnap_profiled", False):
        return False
    for name in ("create_and_map", "unmap_and_release"):
        fn = getattr(cumem, name, None)
        if callable(fn):
            setattr(cumem, name, timed(f"alloc {name}", fn))
    cls = getattr(cumem, "CuMemAllocator", None)
    for name in ("sleep", "wake_up", "discard"):
        fn = getattr(cls, name, None) if cls is not None else None
        if callable(fn):
            setattr(cls, name, timed(f"alloc CuMemAllocator.{name}", fn))
    gc_module = getattr(cumem, "gc", None)
    if gc_module is not None:
        cumem.gc = _Proxy(gc_module, {"collect": timed("alloc gc.collect", gc_module.collect)})
    torch = getattr(cumem, "torch", None)
    if torch is not None:
        subs = {}
        for sub in ("cuda", "accelerator"):
            mod = getattr(torch, sub, None)
            if mod is not None and callable(getattr(mod, "empty_cache", None)):
                subs[sub] = _Proxy(mod, {"empty_cache": timed(f"alloc {sub}.empty_cache", mod.empty_cache)})
        if subs:
            cumem.torch = _Proxy(torch, subs)
    cumem._vsnap_profiled = True
    return True
