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
from dataclasses import dataclass


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


def _cumem():
    try:
        return importlib.import_module("vllm.device_allocator.cumem")
    except ImportError as e:
        raise BridgeUnsupported(f"vllm.device_allocator.cumem is not importable ({e}): sleep mode is unavailable") from e


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


def allocation_for_handle(handle):
    alloc = allocator()
    data = alloc.pointer_to_data.get(handle[2]) if alloc is not None else None
    return _to_allocation(data) if data is not None else None


def install_hooks(tag, on_create, after_map, before_unmap):
    """Keeps memory of `tag` exportable across sleep and wake, and tells the bridge when it is
    mapped. Official hooks first: `before_unmap()` before vLLM unmaps the tag's memory,
    `after_map()` after a wake has mapped it (the bridge then rehomes, copying whatever a level-1
    wake restored). Otherwise the module-level `create_and_map` / `unmap_and_release` are
    wrapped: `on_create(allocation)` creates exportable memory in place of vLLM's, and
    `before_unmap()` runs before the tag's memory is released. Returns the way chosen."""
    package = importlib.import_module("vllm.device_allocator")
    register = getattr(package, "register_tag_hooks", None)
    if callable(register):
        register(tag, before_unmap, after_map)
        return "register_tag_hooks"
    cumem = _cumem()
    create, release = getattr(cumem, "create_and_map", None), getattr(cumem, "unmap_and_release", None)
    if not callable(create) or not callable(release):
        raise BridgeUnsupported("this vLLM has neither register_tag_hooks nor module-level create_and_map/unmap_and_release to wrap")
    if getattr(create, "_vsnap_wrapped", False):
        return "wrapped create_and_map"

    @functools.wraps(create)
    def create_and_map(handle):
        allocation = allocation_for_handle(handle)
        if allocation is not None and allocation.tag == tag:
            on_create(allocation)
        else:
            create(handle)

    @functools.wraps(release)
    def unmap_and_release(handle):
        allocation = allocation_for_handle(handle)
        if allocation is not None and allocation.tag == tag:
            before_unmap()
        release(handle)

    create_and_map._vsnap_wrapped = True
    cumem.create_and_map = create_and_map
    cumem.unmap_and_release = unmap_and_release
    return "wrapped create_and_map"


# ---------------------------------------------------------------------------- workers

def worker_class():
    try:
        return importlib.import_module("vllm.v1.worker.gpu_worker").Worker
    except (ImportError, AttributeError) as e:
        raise BridgeUnsupported(f"vllm.v1.worker.gpu_worker.Worker not found ({e})") from e


def patch_worker(after_load, methods):
    """Runs `after_load(worker)` after Worker.load_model, and adds `methods` to Worker so that
    collective_rpc can call them. Idempotent."""
    cls = worker_class()
    original = cls.load_model
    if not getattr(original, "_vsnap_wrapped", False):

        @functools.wraps(original)
        def load_model(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            after_load(self)
            return result

        load_model._vsnap_wrapped = True
        cls.load_model = load_model
    for name, fn in methods.items():
        setattr(cls, name, fn)


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
    device = getattr(worker, "local_rank", None)
    if device is None:
        device = getattr(getattr(worker, "device", None), "index", 0)
    return int(device or 0)


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

def patch_api_server(mount):
    """Calls `mount(app)` on the app vLLM's API server builds (wrapping build_app). Returns False
    where there is no such hook point: the dev routes are then the fallback."""
    try:
        module = importlib.import_module("vllm.entrypoints.openai.api_server")
    except ImportError:
        return False
    original = getattr(module, "build_app", None)
    if not callable(original):
        return False
    if getattr(original, "_vsnap_wrapped", False):
        return True

    @functools.wraps(original)
    def build_app(*args, **kwargs):
        app = original(*args, **kwargs)
        mount(app)
        return app

    build_app._vsnap_wrapped = True
    module.build_app = build_app
    return True


def add_route(app, path, endpoint, methods):
    add = getattr(app, "add_api_route", None)
    if not callable(add):
        raise BridgeUnsupported("the API app has no add_api_route")
    add(path, endpoint, methods=methods)


def engine_client(request):
    state = getattr(request.app, "state", None)
    client = getattr(state, "engine_client", None)
    if client is None:
        raise BridgeUnsupported("request.app.state.engine_client is missing")
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
    await client.sleep(level, **kwargs)


async def wake_up(client, tags):
    await client.wake_up(tags)


async def is_sleeping(client):
    return bool(await client.is_sleeping())


async def collective_rpc(client, method, args=()):
    return await client.collective_rpc(method, args=tuple(args))


async def reset_prefix_cache(client):
    await client.reset_prefix_cache()


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
