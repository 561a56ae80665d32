"""The /vsnap/v1 routes on vLLM's API server: status, describe, digest, export, sleep, wake, reset_prefix_cache,
release_kv_cache, reload_weights. How they got there (an endpoint plugin, a wrapped build_app, or not at all) is
in MOUNTED and in the status answer.

Every route needs `Authorization: Bearer $VSNAP_TOKEN` (compared in constant time), so the
engine can be driven without VLLM_SERVER_DEV_MODE, whose routes nobody authenticates. With no
VSNAP_TOKEN set the routes answer 503 and do nothing.
"""

import hmac
import json
import logging

from . import adapter, profile, settings

log = logging.getLogger("vsnap_vllm")
PREFIX = "/vsnap/v1"
# How this process's routes were attached: {"mechanism": "endpoint_plugins" | "build_app wrap" |
# None, "detail": str}. Set by mount() and by the general plugin when no mechanism applies.
MOUNTED = {"mechanism": None, "detail": "the vsnap routes were not attached in this process"}


class HttpError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _authorize(request):
    token = settings.token()
    if not token:
        raise HttpError(503, "VSNAP_TOKEN is not set on the engine: the vsnap routes are disabled")
    header = request.headers.get("authorization") or ""
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), token.encode()):
        raise HttpError(401, "missing or wrong bearer token")


async def _json_body(request):
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise HttpError(400, f"body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise HttpError(400, "body must be a JSON object")
    return body


def _request_class():
    """Starlette's Request (vLLM's API server is FastAPI on Starlette), or None without it."""
    try:
        from starlette.requests import Request
    except ImportError:
        return None
    return Request


def _route(handler):
    step = f"vsnap.route {handler.__name__}"

    async def endpoint(request):
        try:
            _authorize(request)
            with profile.span(step):
                status, content = await handler(request, adapter.engine_client(request))
        except HttpError as e:
            status, content = e.status, {"error": str(e)}
        except adapter.BridgeUnsupported as e:  # no engine here, or the engine lacks a feature
            status, content = 503, {"error": str(e)}
        except Exception as e:  # the engine or a worker failed: say what happened
            log.exception("vsnap route failed")
            status, content = 500, {"error": f"{type(e).__name__}: {e}"}
        return adapter.json_response(content, status)

    endpoint.__name__ = f"vsnap_{handler.__name__}"
    # FastAPI hands the request only to a parameter annotated Request; any other parameter is read
    # from the query string (an unannotated `request` became a required query field: every call
    # answered 422). Servers that call endpoints positionally are unaffected.
    request_class = _request_class()
    if request_class is not None:
        endpoint.__annotations__ = {"request": request_class}
    return endpoint


async def status(request, client):
    ranks = await adapter.collective_rpc(client, "vsnap_status")
    first = ranks[0] if ranks and isinstance(ranks[0], dict) else {}
    features = {"releaseKvCache": callable(getattr(client, "release_kv_cache_memory", None))}
    return 200, {"engine": first.get("engine"), "model": first.get("model"), "sleeping": await adapter.is_sleeping(client),
                 "routes": dict(MOUNTED), "features": features, "ranks": ranks}


async def export(request, client):
    body = await _json_body(request)
    socket_path, nonces = body.get("socket"), body.get("nonces")
    if not isinstance(socket_path, str) or not isinstance(nonces, list) or not all(isinstance(n, str) for n in nonces):
        raise HttpError(400, 'expected {"socket": "<path>", "nonces": ["<one per rank>", ...], "digestChunkSize": <optional>}')
    # With digestChunkSize, each worker's header carries its regions' digests too (a suspend that
    # keeps the weights on the GPU: the dirty check and the export in one call).
    chunk_size = body.get("digestChunkSize")
    if chunk_size is None:
        args = (socket_path, nonces)
    else:
        _check_chunk_size(chunk_size, "digestChunkSize")
        args = (socket_path, nonces, chunk_size)
    ranks = await adapter.collective_rpc(client, "vsnap_export", args)
    return 200, {"ranks": ranks}


def _check_chunk_size(chunk_size, name):
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size <= 0 or chunk_size % 16 or chunk_size > 1 << 30:
        raise HttpError(400, f'expected {{"{name}": <a positive multiple of 16 up to 1 GiB>}}')


async def describe(request, client):
    # The weights region table of every rank, asleep or awake, without descriptors: a restore fills
    # new memory for it before the wake and hands that over with the wake's adopt.
    ranks = await adapter.collective_rpc(client, "vsnap_describe")
    return 200, {"ranks": ranks}


async def digest(request, client):
    # Every rank's region table with the GPU digests of its weights, computed in the workers over
    # the memory they have mapped: the SDK's dirty check before a suspend, with no export.
    body = await _json_body(request)
    chunk_size = body.get("chunkSize")
    _check_chunk_size(chunk_size, "chunkSize")
    ranks = await adapter.collective_rpc(client, "vsnap_digest", (chunk_size,))
    return 200, {"ranks": ranks}


async def sleep(request, client):
    body = await _json_body(request)
    level = body.get("level", 1)
    if level not in (0, 1, 2):
        raise HttpError(400, "level must be 0, 1 or 2")
    mode = body.get("mode")
    await adapter.sleep(client, level, mode)
    return 200, {"status": "sleeping", "level": level}


async def wake(request, client):
    body = await _json_body(request)
    tags = body.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
        raise HttpError(400, "tags must be a list of strings, or absent for all")
    adopt = body.get("adopt")
    if adopt is not None:
        # tier 0: fetch the weights the SDK kept on the GPU; the wake maps them back, no copy
        if not isinstance(adopt, dict) or not isinstance(adopt.get("socket"), str) or not isinstance(adopt.get("nonces"), list):
            raise HttpError(400, 'adopt must be {"socket": "<path>", "nonces": ["<one per rank>", ...]}')
        await adapter.collective_rpc(client, "vsnap_adopt", (adopt["socket"], adopt["nonces"]))
    await adapter.wake_up(client, tags)
    return 200, {"status": "awake" if not await adapter.is_sleeping(client) else "sleeping", "tagsWoken": tags}


async def reset_prefix_cache(request, client):
    if not await adapter.reset_prefix_cache(client):
        raise HttpError(409, "the engine did not reset its prefix cache (requests running?): drain it and retry")
    return 200, {"status": "ok", "success": True}


async def release_kv_cache(request, client):
    body = await _json_body(request)
    queued = body.get("queued", "wait")
    if queued not in adapter.QUEUED_POLICIES:
        raise HttpError(400, 'queued must be "wait" (let queued requests finish first) or "abort"')
    try:
        attempts = await adapter.release_kv_cache_memory(client, queued)
    except adapter.BridgeUnsupported as e:
        raise HttpError(501, str(e)) from e
    except adapter.EngineBusy as e:
        raise HttpError(409, str(e)) from e
    return 200, {"status": "kv_cache_released", "attempts": attempts}


async def reload_weights(request, client):
    # The recovery path when no snapshot can be used: the documented level-2 wake is
    # wake_up(tags=["weights"]), collective_rpc("reload_weights"), wake_up(tags=["kv_cache"])
    # (docs/features/sleep_mode.md); Worker.reload_weights (vllm/v1/worker/gpu_worker.py) has the
    # model loader read the checkpoint again into the woken weights memory.
    await adapter.collective_rpc(client, "reload_weights")
    return 200, {"status": "reloaded"}


ROUTES = [
    ("/status", status, ["GET"]),
    ("/describe", describe, ["GET"]),
    ("/digest", digest, ["POST"]),
    ("/export", export, ["POST"]),
    ("/sleep", sleep, ["POST"]),
    ("/wake", wake, ["POST"]),
    ("/reset_prefix_cache", reset_prefix_cache, ["POST"]),
    ("/release_kv_cache", release_kv_cache, ["POST"]),
    ("/reload_weights", reload_weights, ["POST"]),
]


def mount(app, mechanism="build_app wrap", detail=None):
    for path, handler, methods in ROUTES:
        adapter.add_route(app, PREFIX + path, _route(handler), methods)
    MOUNTED.update(mechanism=mechanism, detail=detail or mechanism)
    log.info("vsnap: routes %s/* attached (%s)", PREFIX, MOUNTED["detail"])
    if not settings.token():
        log.warning("vsnap: VSNAP_TOKEN is not set; the /vsnap/v1 routes will refuse every request")
