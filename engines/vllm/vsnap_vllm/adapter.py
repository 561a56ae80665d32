"""Everything the bridge knows about vLLM's internals, in one place (see VLLM-FACTS.md of the
vsnap project). Each function detects the feature it needs instead of assuming a version, and
fails with a message that says what is missing.

The allocator: vllm.device_allocator.cumem.CuMemAllocator (a singleton) keeps
`pointer_to_data: {va: AllocationData(handle, tag, ...)}`; a handle is the 4-tuple
(device, aligned_size, va, address of a heap CUmemGenericAllocationHandle). Module-level
`create_and_map(handle)` / `unmap_and_release(handle)` are what sleep and wake call. Newer
versions have `vllm.device_allocator.register_tag_hooks(tag, before_unmap, after_map)`.
"""

import ctypes
import functools
import importlib
import inspect
import os
import sys
from dataclasses import dataclass

from . import profile


class BridgeUnsupported(RuntimeError):
    """The running vLLM lacks something the bridge needs; the message says what."""


@dataclass
class Allocation:
    device: int
    size: int
    va: int
    handle_slot: int  # address of the CUmemGenericAllocationHandle vLLM frees on release
    tag: str

    @property
    def handle(self):
        return ctypes.c_uint64.from_address(self.handle_slot).value

    def set_handle(self, value):
        """Points vLLM's slot at another handle: vLLM's own release then frees that one."""
        ctypes.c_uint64.from_address(self.handle_slot).value = value


# vLLM main keeps the allocator in vllm/device_allocator/cumem.py. A restructure pull request
# (closed unmerged) moved it to vllm/backends/platform/device_allocator/ with shims at the old
# paths (a lazy __getattr__ package, sys.modules aliases): the class's own module is what counts.
_ALLOCATOR_MODULES = ("vllm.device_allocator.cumem", "vllm.backends.platform.device_allocator.cumem")


def _cumem():
    """The module that defines CuMemAllocator: its globals are what sleep and wake call, so its
    module-level functions are the ones to wrap (wrapping a shim's attribute would change nothing)."""
    errors = []
    for name in _ALLOCATOR_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
            continue
        cls = getattr(module, "CuMemAllocator", None)
        if cls is not None:
            return sys.modules.get(getattr(cls, "__module__", name), module)
        errors.append(f"{name} has no CuMemAllocator")
    raise BridgeUnsupported("vLLM's sleep-mode allocator was not found (" + "; ".join(errors) + "): sleep mode is unavailable")


def vllm_version():
    try:
        return importlib.import_module("vllm").__version__
    except (ImportError, AttributeError):
        return "unknown"


def allocator():
    """The CuMemAllocator singleton, or None when sleep mode is not in use."""
    cls = getattr(_cumem(), "CuMemAllocator", None)
    if cls is None:
        raise BridgeUnsupported("vllm.device_allocator.cumem has no CuMemAllocator")
    return getattr(cls, "instance", None)


def _to_allocation(data):
    handle = data.handle
    if not (isinstance(handle, tuple) and len(handle) == 4 and isinstance(handle[3], int)):
        raise BridgeUnsupported(f"unexpected allocation handle {handle!r}: only (device, size, va, slot) handles are supported (not ROCm's chunked ones)")
    device, size, va, slot = handle
    return Allocation(device=device, size=size, va=va, handle_slot=slot, tag=data.tag)


def allocations(tag=None):
    """The allocator's allocations (of one tag), in address order."""
    alloc = allocator()
    if alloc is None:
        return []
    table = getattr(alloc, "pointer_to_data", None)
    if table is None:
        raise BridgeUnsupported("CuMemAllocator has no pointer_to_data")
    out = [_to_allocation(d) for d in table.values() if tag is None or d.tag == tag]
    return sorted(out, key=lambda a: a.va)


def asleep_tags():
    """The allocator's tags with an allocation asleep (AllocationData.is_asleep, newer vLLM), or
    None where the allocator does not say."""
    alloc = allocator()
    if alloc is None:
        return []
    datas = list(getattr(alloc, "pointer_to_data", {}).values())
    if any(not hasattr(d, "is_asleep") for d in datas):
        return None
    return sorted({d.tag for d in datas if d.is_asleep})


def sleep_mode(owner):
    """Whether vLLM runs with sleep mode, from its configuration (`model_config.enable_sleep_mode`),
    not from the allocator's presence: `--enable-cumem-allocator` (PR #33648) puts the weights in
    the sleep-mode allocator's pool without sleep mode (vllm/v1/worker/gpu_worker.py
    `_maybe_get_memory_pool_context` reads `enable_cumem_allocator`). None where the
    configuration does not say."""
    config = getattr(owner, "vllm_config", None)
    model = getattr(owner, "model_config", None) or getattr(config, "model_config", None)
    value = getattr(model, "enable_sleep_mode", None)
    return None if value is None else bool(value)


def rust_frontend():
    """True when `vllm serve` runs vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1, vllm/envs.py,
    read by vllm/entrypoints/cli/serve.py): no FastAPI app is built, so no endpoint plugin and no
    wrapped build_app can add routes, and vLLM's dev routes are not served either."""
    return os.environ.get("VLLM_USE_RUST_FRONTEND", "0").strip().lower() in ("1", "true")


RUST_FRONTEND_DETAIL = ("VLLM_USE_RUST_FRONTEND=1: vLLM's Rust frontend serves this engine and builds no FastAPI app, so no "
                        "/vsnap/v1 route (and no dev route) can be attached; start it without VLLM_USE_RUST_FRONTEND (or =0) to use vsnap")


def allocation_for_handle(handle):
    alloc = allocator()
    data = alloc.pointer_to_data.get(handle[2]) if alloc is not None else None
    return _to_allocation(data) if data is not None else None


def install_hooks(tag, on_create, after_map, before_unmap, on_failure):
    """Keeps memory of `tag` exportable across sleep and wake, and tells the bridge when it is
    mapped. Official hooks first: `before_unmap()` before vLLM unmaps the tag's memory,
    `after_map()` after a wake has mapped it (the bridge then rehomes, copying whatever a level-1
    wake restored). Otherwise the module-level `create_and_map` / `unmap_and_release` are
    wrapped: `on_create(allocation)` maps exportable memory in place of vLLM's and returns True
    (False: vLLM's own create runs), and `before_unmap()` runs before the tag's memory is
    released. Every hook is guarded: an exception goes to `on_failure(where, exc)` and vLLM
    carries on as if the bridge were absent. Returns the way chosen."""
    cumem = _cumem()
    package = importlib.import_module(cumem.__name__.rpartition(".")[0])
    register = getattr(package, "register_tag_hooks", None)
    if callable(register):
        register(tag, guarded("before_unmap", before_unmap, on_failure), guarded("after_map", after_map, on_failure))
        return "register_tag_hooks"
    create, release = getattr(cumem, "create_and_map", None), getattr(cumem, "unmap_and_release", None)
    if not callable(create) or not callable(release):
        raise BridgeUnsupported("this vLLM has neither register_tag_hooks nor module-level create_and_map/unmap_and_release to wrap")
    if getattr(create, "_vsnap_wrapped", False):
        return "wrapped create_and_map"

    @functools.wraps(create)
    def create_and_map(handle):
        mapped = False
        try:
            allocation = allocation_for_handle(handle)
            if allocation is not None and allocation.tag == tag:
                mapped = bool(on_create(allocation))
        except Exception as e:  # noqa: BLE001 - the bridge must never break a wake
            on_failure("create_and_map", e)
            mapped = False
        if not mapped:
            create(handle)

    @functools.wraps(release)
    def unmap_and_release(handle):
        try:
            allocation = allocation_for_handle(handle)
            if allocation is not None and allocation.tag == tag:
                before_unmap()
        except Exception as e:  # noqa: BLE001 - the bridge must never break a sleep
            on_failure("unmap_and_release", e)
        release(handle)

    create_and_map._vsnap_wrapped = True
    cumem.create_and_map = create_and_map
    cumem.unmap_and_release = unmap_and_release
    return "wrapped create_and_map"


def guarded(where, fn, on_failure):
    """`fn` with every exception reported to `on_failure(where, exc)` instead of raised."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            on_failure(where, e)
            return None

    return call


# ---------------------------------------------------------------------------- workers

def worker_class():
    try:
        return importlib.import_module("vllm.v1.worker.gpu_worker").Worker
    except (ImportError, AttributeError) as e:
        raise BridgeUnsupported(f"vllm.v1.worker.gpu_worker.Worker not found ({e})") from e


def wrap_load_model(after_load, on_failure):
    """Runs `after_load(worker)` after Worker.load_model (an exception goes to
    `on_failure("after_load", exc)`: the load itself always completes). The one patch of vLLM's
    Worker left: no slot runs code once the model is loaded and before the KV cache takes the
    memory a rehome needs and the engine serves (an extension class may not define load_model).
    Idempotent."""
    cls = worker_class()
    original = cls.load_model
    if getattr(original, "_vsnap_wrapped", False):
        return
    hook = guarded("after_load", after_load, on_failure)

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        hook(self)
        return result

    load_model._vsnap_wrapped = True
    cls.load_model = load_model


def add_worker_extension(extension):
    """Adds `extension` to the worker class's bases as vLLM adds --worker-extension-cls's
    (vllm/v1/worker/worker_base.py `init_worker`): once, refusing a clash with an attribute the
    worker has. vLLM then skips it when the same class is named (it is among the bases), and a
    user's own extension class joins beside it."""
    cls = worker_class()
    if extension in cls.__mro__:
        return
    clashes = [a for a in dir(extension) if not a.startswith("__") and hasattr(cls, a)]
    if clashes:
        raise BridgeUnsupported(f"{cls.__qualname__} already has {', '.join(clashes)}: vsnap's worker extension cannot be added")
    cls.__bases__ = cls.__bases__ + (extension,)


def worker_model(worker):
    runner = getattr(worker, "model_runner", None)
    if runner is not None:
        get = getattr(runner, "get_model", None)
        if callable(get):
            return get()
        if getattr(runner, "model", None) is not None:
            return runner.model
    raise BridgeUnsupported("cannot find the worker's model (model_runner.get_model())")


def worker_rank(worker):
    return int(getattr(worker, "rank", 0))


def worker_device(worker):
    """The CUDA device ordinal: `worker.device.index` (vllm/v1/worker/gpu_worker.py sets
    `cuda:{visible id of local_rank}`; `local_rank` is adjusted for data parallelism and is not
    the ordinal). `local_rank` only where a worker has no `device`."""
    index = getattr(getattr(worker, "device", None), "index", None)
    if index is None:
        index = getattr(worker, "local_rank", 0)
    return int(index or 0)


def attention_backend(worker):
    runner = getattr(worker, "model_runner", None)
    backend = getattr(runner, "attn_backend", None)
    if backend is None:
        groups = getattr(runner, "attn_groups", None)
        try:
            backend = groups[0][0].backend if groups else None
        except (IndexError, TypeError, AttributeError):
            backend = None
    get_name = getattr(backend, "get_name", None)
    return get_name() if callable(get_name) else None


# ---------------------------------------------------------------------------- API server

def endpoint_plugins_available():
    """True where this vLLM loads `vllm.endpoint_plugins` entry points (PR #47454, about v0.30):
    vllm/plugins/__init__.py defines load_endpoint_plugins."""
    try:
        plugins = importlib.import_module("vllm.plugins")
    except ImportError:
        return False
    return callable(getattr(plugins, "load_endpoint_plugins", None))


def endpoint_plugin_allowed(name="vsnap"):
    """vLLM loads an endpoint plugin only when VLLM_PLUGINS is set and names it exactly
    (split on ",", no stripping: vllm/plugins/__init__.py, vllm/envs.py)."""
    allowed = os.environ.get("VLLM_PLUGINS")
    return allowed is not None and name in allowed.split(",")


def patch_api_server(mount):
    """For vLLM without endpoint plugins: calls `mount(app)` on the app its API server builds, by
    wrapping `build_app` in `vllm.entrypoints.openai.api_server`, which older versions (to about
    v0.25) define there and call through the module global. Returns (True, how) or (False, why):
    a `build_app` defined elsewhere (a re-export by a shim: newer vLLM calls it in
    vllm/entrypoints/launchers/app.py) or never called through that global would silently add
    no route, so it is refused."""
    name = "vllm.entrypoints.openai.api_server"
    try:
        module = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - importing vLLM's server may fail in a worker
        return False, f"{name} is not importable ({type(e).__name__}: {e})"
    original = getattr(module, "build_app", None)
    if not callable(original):
        return False, f"{name} has no build_app"
    if getattr(original, "_vsnap_wrapped", False):
        return True, f"wrapped {name}.build_app"
    defined_in = getattr(original, "__module__", None)
    if defined_in != module.__name__:
        return False, f"{name}.build_app is a re-export of {defined_in}.build_app: wrapping it would add no route"
    if not _calls_global(module, "build_app"):
        return False, f"nothing in {name} calls build_app through its module global: wrapping it would add no route"

    @functools.wraps(original)
    def build_app(*args, **kwargs):
        app = original(*args, **kwargs)
        mount(app)
        return app

    build_app._vsnap_wrapped = True
    module.build_app = build_app
    return True, f"wrapped {name}.build_app"


def _calls_global(module, name):
    """True when a function defined in `module` (not build_app itself) names `name` as a global."""
    for attr, value in vars(module).items():
        code = getattr(value, "__code__", None)
        if code is None or attr == name or getattr(value, "__module__", None) != module.__name__:
            continue
        stack = [code]
        while stack:
            c = stack.pop()
            if name in c.co_names:
                return True
            stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    return False


def add_route(app, path, endpoint, methods):
    add = getattr(app, "add_api_route", None)
    if not callable(add):
        raise BridgeUnsupported("the API app has no add_api_route")
    add(path, endpoint, methods=methods)


_NO_CLIENT = object()


def engine_client(request):
    """The engine client the endpoint plugin's init_state stored (None on a render server), else
    (older vLLM, wrapped build_app) the app state's."""
    state = getattr(request.app, "state", None)
    client = getattr(state, "vsnap_engine_client", _NO_CLIENT)
    if client is _NO_CLIENT:
        client = getattr(state, "engine_client", None)
    if client is None:
        raise BridgeUnsupported("this API server has no engine client (a render server?): the vsnap routes need an engine")
    return client


def json_response(content, status_code=200):
    try:
        from starlette.responses import JSONResponse
    except ImportError:
        return _PlainJSONResponse(content, status_code)
    return JSONResponse(content, status_code=status_code)


class _PlainJSONResponse:
    """Duck-typed stand-in for starlette's JSONResponse where starlette is absent."""

    media_type = "application/json"

    def __init__(self, content, status_code=200):
        import json

        self.status_code = status_code
        self.body = json.dumps(content).encode()


async def sleep(client, level, mode=None):
    kwargs = {}
    if mode is not None and "mode" in inspect.signature(client.sleep).parameters:
        kwargs["mode"] = mode
    with profile.span("vsnap.client sleep"):
        await client.sleep(level, **kwargs)


async def wake_up(client, tags):
    with profile.span("vsnap.client wake_up"):
        await client.wake_up(tags)


async def is_sleeping(client):
    with profile.span("vsnap.client is_sleeping"):
        return bool(await client.is_sleeping())


async def collective_rpc(client, method, args=()):
    with profile.span(f"vsnap.client collective_rpc {method}"):
        return await client.collective_rpc(method, args=tuple(args))


async def reset_prefix_cache(client):
    """True when the engine reset its prefix cache. vllm/engine/protocol.py:
    `reset_prefix_cache(reset_running_requests=False, reset_connector=False) -> bool`; older
    versions return None (taken as done)."""
    with profile.span("vsnap.client reset_prefix_cache"):
        result = await client.reset_prefix_cache()
    return True if result is None else bool(result)


class EngineBusy(RuntimeError):
    """The engine kept requests queued: vLLM will not release the KV cache under them."""


RELEASE_ATTEMPTS = 8
RELEASE_BACKOFF = 0.05  # seconds before the second attempt, doubling, at most 1 s
QUEUED_POLICIES = ("wait", "abort")


def _requests_queued(error):
    # vllm/v1/engine/core.py `release_kv_cache_memory`: "requires a completed pause first" unless
    # the scheduler is paused with no requests queued and no batch in flight.
    return "completed pause" in str(error)


async def resume(client):
    """Resumes a level-0 pause: wake_up(["scheduling"]) (vllm/v1/engine/core.py `EngineCore.wake_up`:
    "scheduling" alone wakes no memory and resumes once nothing is asleep). Never raises."""
    try:
        await wake_up(client, ["scheduling"])
    except Exception:  # noqa: BLE001 - reported by the caller's own error
        import logging

        logging.getLogger("vsnap_vllm").exception("vsnap: resuming the engine after a failed KV-cache release failed")


async def release_kv_cache_memory(client, queued="wait", attempts=RELEASE_ATTEMPTS, backoff=None):
    """The engine's own weight-resident suspend (PR #44890): pause, then discard the KV cache;
    `wake_up(["kv_cache"])` undoes both. vLLM refuses the release while any request is queued
    or running, and a pause of mode `keep` keeps them: so `queued="wait"` pauses with mode `wait`
    (running requests finish) and, while requests stay queued, resumes the engine (they are
    admitted), waits and tries again, `attempts` times; `queued="abort"` pauses with mode `abort`
    (every request aborted). After any failure the engine is resumed, never left paused. Returns
    the number of attempts; EngineBusy when requests were still queued at the last."""
    release = getattr(client, "release_kv_cache_memory", None)
    if not callable(release):
        raise BridgeUnsupported("this vLLM's engine client has no release_kv_cache_memory (added about v0.30, PR #44890)")
    if queued not in QUEUED_POLICIES:
        raise ValueError(f"queued must be one of {QUEUED_POLICIES}, not {queued!r}")
    for attempt in range(1, attempts + 1):
        await sleep(client, 0, queued)
        try:
            with profile.span("vsnap.client release_kv_cache_memory"):
                await release()
            return attempt
        except Exception as e:
            await resume(client)
            if not _requests_queued(e):
                raise
            if queued == "abort" or attempt == attempts:
                raise EngineBusy(f"the engine still had requests queued after {attempt} attempt(s) ({e}); it was resumed. "
                                 "Retry when it is idle, or release with queued 'abort' (the queued requests are aborted)") from e
        import asyncio

        await asyncio.sleep(min((RELEASE_BACKOFF if backoff is None else backoff) * 2 ** (attempt - 1), 1.0))
    raise AssertionError("unreachable")


def engine_facts(owner):
    """Engine and model facts for the manifest, from the configuration a worker (or the engine
    client) holds: `vllm_config` / `model_config`."""
    config = getattr(owner, "vllm_config", None)
    model = getattr(owner, "model_config", None) or getattr(config, "model_config", None)
    parallel = getattr(config, "parallel_config", None)

    def pick(obj, *names):
        for name in names:
            value = getattr(obj, name, None)
            if value is not None:
                return value
        return None

    dtype = pick(model, "dtype")
    return {
        "engine": {"kind": "vllm", "version": vllm_version()},
        "model": {
            "id": pick(model, "model", "served_model_name") or "unknown",
            "revision": pick(model, "revision", "code_revision"),
            "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
            "quantization": pick(model, "quantization"),
            "tensorParallelSize": int(pick(parallel, "tensor_parallel_size") or 1),
            "pipelineParallelSize": int(pick(parallel, "pipeline_parallel_size") or 1),
        },
    }
