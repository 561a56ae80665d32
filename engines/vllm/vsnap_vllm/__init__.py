"""vsnap-vllm: the vLLM side of vsnap. Loaded by vLLM in every process through the
`vllm.general_plugins` entry point (VLLM_PLUGINS=vsnap). In worker processes it makes the
weights memory exportable and adds the vsnap_status / vsnap_export worker methods; in the API
server it adds the authenticated /vsnap/v1 routes. Set VSNAP_VLLM_DISABLE=1 to turn it off."""

__version__ = "0.1.0"

_registered = False


def register():
    """The entry point vLLM calls; safe to call more than once."""
    global _registered
    if _registered:
        return
    _registered = True
    import logging

    from . import settings

    if settings.disabled():
        return
    from . import adapter, api, bridge

    log = logging.getLogger("vsnap_vllm")
    # Worker side (runs in every process; only a worker ever calls load_model).
    try:
        adapter.patch_worker(bridge.BRIDGE.after_load, bridge.WORKER_METHODS, bridge.BRIDGE.fail)
    except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        bridge.BRIDGE.fail("patch_worker", e)
    if adapter.rust_frontend():
        # No FastAPI app will exist in this serve: nothing below can attach a route.
        api.MOUNTED.update(mechanism=None, detail=adapter.RUST_FRONTEND_DETAIL)
        log.warning("vsnap: %s", adapter.RUST_FRONTEND_DETAIL)
        return
    # API-server side: the endpoint plugin (entry point vsnap_vllm.endpoint:plugin) attaches the
    # routes where vLLM has endpoint plugins; older vLLM gets a wrapped build_app where that is
    # detected to work; otherwise nothing, said loudly.
    try:
        if adapter.endpoint_plugins_available():
            if not adapter.endpoint_plugin_allowed():
                api.MOUNTED.update(mechanism=None, detail="VLLM_PLUGINS does not name 'vsnap' exactly: vLLM loads no endpoint plugin")
                log.warning("vsnap: VLLM_PLUGINS does not name 'vsnap': the /vsnap/v1 routes will NOT be attached (set VLLM_PLUGINS=vsnap)")
            return
        ok, how = adapter.patch_api_server(api.mount)
        if not ok:
            api.MOUNTED.update(mechanism=None, detail=how)
            log.warning("vsnap: the /vsnap/v1 routes cannot be attached in this vLLM (%s); use the dev routes (VLLM_SERVER_DEV_MODE=1)", how)
    except Exception as e:  # noqa: BLE001
        api.MOUNTED.update(mechanism=None, detail=f"{type(e).__name__}: {e}")
        log.exception("vsnap: the /vsnap/v1 routes could NOT be attached")
