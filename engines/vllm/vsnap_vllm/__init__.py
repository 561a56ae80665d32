"""vsnap-vllm: the vLLM side of vsnap. Loaded by vLLM in every process through the
`vllm.general_plugins` entry point (VLLM_PLUGINS=vsnap). In worker processes it makes the
weights memory exportable and adds the vsnap_status / vsnap_export worker methods (the worker
extension class VsnapWorkerExtension); in the API server it adds the authenticated /vsnap/v1
routes; everywhere it registers the `vsnap` sleep-mode backend. VSNAP_VLLM_DISABLE=1 turns it off."""

__version__ = "0.1.0"

_registered = False
__all__ = ["VsnapWorkerExtension", "register"]


def __getattr__(name):
    if name == "VsnapWorkerExtension":  # `--worker-extension-cls vsnap_vllm.VsnapWorkerExtension`
        from .worker import VsnapWorkerExtension

        return VsnapWorkerExtension
    raise AttributeError(name)


def register():
    """The entry point vLLM calls; safe to call more than once."""
    global _registered
    if _registered:
        return
    _registered = True
    import logging

    from . import settings

    try:
        if settings.disabled():
            return
    except settings.SettingError as err:
        # a plugin never stops vLLM from starting: a bad switch turns the plugin off, said once
        logging.getLogger("vsnap_vllm").error("vsnap plugin disabled: %s", err)
        return
    from . import adapter, api, bridge

    log = logging.getLogger("vsnap_vllm")
    register_sleep_backend(log)
    # Worker side (runs in every process; only a worker ever calls load_model): the worker methods
    # as an extension class (worker.py), the bridge's after-load step (adapter.wrap_load_model).
    try:
        from .worker import VsnapWorkerExtension

        def after_load(worker):
            # after vLLM added the class --worker-extension-cls names (init_worker, before the
            # worker exists): a class that mixes VsnapWorkerExtension in is then left as it is
            adapter.add_worker_extension(VsnapWorkerExtension)
            bridge.BRIDGE.after_load(worker)

        adapter.wrap_load_model(after_load, bridge.BRIDGE.fail)
    except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        bridge.BRIDGE.fail("worker extension", e)
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


def register_sleep_backend(log):
    """Registers the `vsnap` sleep-mode backend (--sleep-mode-backend vsnap) where vLLM has
    SleepModeBackendFactory; lazy: its module is imported only when an engine selects it."""
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
    except ImportError:
        log.info("vsnap: this vLLM has no pluggable sleep-mode backends: --sleep-mode-backend vsnap is unavailable")
        return
    try:
        SleepModeBackendFactory.register_backend("vsnap", "vsnap_vllm.sleep_backend", "VsnapSleepBackend")
    except ValueError:
        pass  # registered already in this process (a plugin may be loaded more than once)
    except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        log.warning("vsnap: the vsnap sleep-mode backend could not be registered (%s: %s)", type(e).__name__, e)
