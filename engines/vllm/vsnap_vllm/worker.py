"""The worker methods the SDK calls on every rank through collective_rpc, as a vLLM worker
extension: `--worker-extension-cls vsnap_vllm.VsnapWorkerExtension` (vLLM's
ParallelConfig.worker_extension_cls: the class joins the worker's bases, its methods answer
collective_rpc).

vLLM takes one extension class, and RL frameworks set their own; so once the model is loaded
the plugin adds this class to the worker's bases itself, the way vLLM adds the named one
(adapter.add_worker_extension), unless the worker has it already. Any of these works:

    --worker-extension-cls my_rl.WeightSyncExtension        # vsnap's methods are added beside it
    --worker-extension-cls my_rl.Combined                   # class Combined(VsnapWorkerExtension, WeightSyncExtension)
    --worker-extension-cls vsnap_vllm.VsnapWorkerExtension  # the same as naming none
"""

from . import bridge


class VsnapWorkerExtension:
    def vsnap_status(self):
        """This rank's bridge status."""
        return bridge.vsnap_status(self)

    def vsnap_describe(self):
        """This rank's weights region table, asleep or awake (no descriptors)."""
        return bridge.vsnap_describe(self)

    def vsnap_digest(self, chunk_size):
        """This rank's weights region table with the digests of its weights."""
        return bridge.vsnap_digest(self, chunk_size)

    def vsnap_export(self, socket_path, nonces, chunk_size=None):
        """Sends this rank's weights regions to the SDK (with their digests, given a chunk size)."""
        return bridge.vsnap_export(self, socket_path, nonces, chunk_size)

    def vsnap_adopt(self, socket_path, nonces):
        """Fetches the weights the SDK kept on the GPU, for the next wake."""
        return bridge.vsnap_adopt(self, socket_path, nonces)
