"""The `vllm.endpoint_plugins` entry point (vLLM about v0.30+, PR #47454): the main way the
/vsnap/v1 routes get onto `vllm serve`'s app. Contract (vllm/plugins/endpoint_plugins/
interface.py): the entry point is a zero-argument factory returning an object with `name`,
`required_tasks`, `attach_router(app)` (called once in build_app, after vLLM's own routers) and
`async init_state(engine_client, state, args)` (called in init_app_state; `engine_client` is None
on the CPU-only render server). vLLM loads it only when VLLM_PLUGINS names it exactly.
Neither method may raise into vLLM: a failure is logged and reported in the status."""

import logging

from . import api

log = logging.getLogger("vsnap_vllm")


class VsnapEndpointPlugin:
    name = "vsnap"
    # Eligible everywhere, render servers included: there the routes answer that no engine is
    # attached instead of silently not existing.
    required_tasks = None

    def attach_router(self, app):
        try:
            api.mount(app, "endpoint_plugins", "vllm.endpoint_plugins entry point 'vsnap'")
        except Exception as e:  # noqa: BLE001 - never break vLLM's app
            api.MOUNTED.update(mechanism=None, detail=f"the endpoint plugin could not attach its routes: {type(e).__name__}: {e}")
            log.exception("vsnap: the /vsnap/v1 routes could NOT be attached")

    async def init_state(self, engine_client, state, args):
        try:
            # The routes use this client (not app.state.engine_client): the documented access path.
            state.vsnap_engine_client = engine_client
            if engine_client is None:
                log.warning("vsnap: no engine client in this server (a render server): the /vsnap/v1 routes will answer 503")
        except Exception:  # noqa: BLE001
            log.exception("vsnap: could not keep the engine client")


def plugin():
    """The entry point: `vsnap = "vsnap_vllm.endpoint:plugin"` in group vllm.endpoint_plugins."""
    return VsnapEndpointPlugin()
