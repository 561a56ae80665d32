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
    import os

    if os.environ.get("VSNAP_VLLM_DISABLE") == "1":
        return
    from . import adapter, api, bridge

    log = logging.getLogger("vsnap_vllm")
    try:
        adapter.patch_worker(bridge.BRIDGE.after_load, bridge.WORKER_METHODS)
    except adapter.BridgeUnsupported as e:
        log.warning("vsnap: worker hooks not installed: %s", e)
    if not adapter.patch_api_server(api.mount):
        log.info("vsnap: no API server hook point in this process; use the dev routes (VLLM_SERVER_DEV_MODE=1)")
