"""The reference engine's tensor-parallel executor (test/fixtures/engine/vllm/v1/executor/
multiproc_executor.py, after vLLM's): one process per rank, the plugin loaded in each, results in
rank order, a worker's error naming its rank, a dead worker failing the executor and taking the
others down; and the host model's answer depending on every rank's bytes."""

import ctypes
import os
import signal
import sys
import tempfile
import time
import types
import unittest

from . import support  # noqa: F401 - puts the stand-in vllm package on sys.path


def _args(tp=2, seed=1):
    return types.SimpleNamespace(device="host", model="vsnap/tp-test", revision="seed-1", dtype="bfloat16", seed=seed, layers=2,
                                 hidden=256, enable_sleep_mode=True, tensor_parallel_size=tp, keeps_workspace=False,
                                 sleep_mode_offload_cudagraph=False)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2] != "Z"


class MultiprocExecutorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The plugin installed where every spawned worker finds its entry point (sys.path travels with spawn).
        cls.site = tempfile.mkdtemp(prefix="vsnap-tp-site-")
        from plugin_site import make_plugin_site

        make_plugin_site(cls.site)
        sys.path.insert(0, cls.site)
        cls.env = {k: os.environ.get(k) for k in ("VLLM_PLUGINS", "VSNAP_REF_DEVICE", "VSNAP_VLLM_HOST_MEMORY")}
        os.environ.update(VLLM_PLUGINS="vsnap", VSNAP_REF_DEVICE="host", VSNAP_VLLM_HOST_MEMORY="1")

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(cls.site)
        for k, v in cls.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        import shutil

        shutil.rmtree(cls.site, ignore_errors=True)

    def start(self, on_failure=None):
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        executor = MultiprocExecutor(_args(), 2, on_failure)
        self.addCleanup(executor.shutdown)
        return executor

    def test_one_process_per_rank_plugin_in_each_results_in_rank_order(self):
        executor = self.start()
        self.assertEqual(len(set(executor.pids)), 2)
        self.assertNotIn(os.getpid(), executor.pids)
        ranks = executor.collective_rpc("vsnap_status")
        self.assertEqual([r["rank"] for r in ranks], [0, 1])
        self.assertEqual([r["pid"] for r in ranks], executor.pids)
        self.assertEqual([r["device"]["ordinal"] for r in ranks], [0, 1])
        self.assertEqual([r["model"]["tensorParallelSize"] for r in ranks], [2, 2])
        self.assertTrue(all(r["supported"] and r["regions"] > 0 for r in ranks), ranks)
        states = executor.collective_rpc("ref_state", args=([1, 2, 3],))
        self.assertNotEqual(states[0], states[1])  # each rank its own shard

    def test_a_worker_error_fails_the_call_naming_its_rank(self):
        executor = self.start()
        with self.assertRaisesRegex(RuntimeError, r"Worker failed with error 'AttributeError.*\(rank 0\)"):
            executor.collective_rpc("no_such_method")
        self.assertEqual(len(executor.collective_rpc("ref_memory_asleep")), 2)  # still usable

    def test_a_dead_worker_fails_the_executor_and_takes_the_other_down(self):
        reasons = []
        executor = self.start(on_failure=reasons.append)
        os.kill(executor.pids[1], signal.SIGKILL)
        for _ in range(100):
            if reasons and not any(_alive(p) for p in executor.pids):
                break
            time.sleep(0.05)
        self.assertEqual(reasons, ["worker proc VllmWorker-1 died unexpectedly"])
        self.assertFalse(any(_alive(p) for p in executor.pids))
        with self.assertRaisesRegex(RuntimeError, "Executor failed: worker proc VllmWorker-1 died"):
            executor.collective_rpc("ref_memory_asleep")


class HostModelShardsTest(unittest.TestCase):
    def test_a_byte_of_any_rank_changes_the_answer(self):
        from host_model import HostModel, combine_states, tokens_from

        args = _args()
        args.enable_sleep_mode = False
        shards = [HostModel(args, rank) for rank in (0, 1)]
        for shard in shards:
            shard.load()
        self.assertEqual(shards[0].params["model.layers.0.mlp.weight"].shape, (512, 256))  # 1024 / 2 ranks
        prompt = [7, 8, 9]

        def answer():
            return tokens_from(combine_states([s.state(prompt) for s in shards]), 8)

        before = answer()
        for rank in (0, 1):
            va, _ = shards[rank].segments[3]
            byte = ctypes.c_ubyte.from_address(va + 100)
            byte.value ^= 1
            self.assertNotEqual(answer(), before, f"a byte of rank {rank}")
            byte.value ^= 1
            self.assertEqual(answer(), before)

    def test_one_rank_is_the_unsharded_model(self):
        from host_model import HostModel

        args = _args(tp=1)
        args.enable_sleep_mode = False
        model = HostModel(args)
        model.load()
        self.assertEqual(model.params["model.layers.0.mlp.weight"].shape, (1024, 256))


class ParallelDecodingTest(unittest.TestCase):
    """The GPU model's combine step (EngineCore._generate_parallel), with fixed per-rank logits."""

    def test_sums_the_ranks_logits_in_rank_order_and_decodes_greedily(self):
        import array
        import base64
        import math

        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor as Base

        vocab = 6
        rank_logits = [[0.5, 2.0, -1.0, 0.0, 1.5, 0.25], [0.0, -1.5, 1.4, 0.0, 1.2, 0.5]]
        calls = []

        class Executor(Base):
            def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
                calls.append((method, args))
                shift = len(calls) - 1  # a different winner each step
                return [base64.b64encode(array.array("f", [v + (shift if i == (shift % vocab) else 0) for i, v in enumerate(r)]).tobytes()).decode()
                        for r in rank_logits]

        core = EngineCore(Executor(), types.SimpleNamespace(device="cuda"))
        ids, logprobs = core.generate([11, 12, 13], 3)
        total = [a + b for a, b in zip(*rank_logits)]  # 0.5, 0.5, 0.4, 0.0, 2.7, 0.75
        self.assertEqual(ids[0], 4)  # neither rank's own best (rank 0 alone: 1, rank 1 alone: 2): the sum decides
        norm = math.log(sum(math.exp(v) for v in total))
        self.assertAlmostEqual(logprobs[0], total[ids[0]] - norm, places=5)
        # the prompt first (from 0), then one token at a time after it
        self.assertEqual(calls[0], ("ref_logits", ([11, 12, 13], 0, False)))
        self.assertEqual(calls[1], ("ref_logits", ([ids[0]], 3, False)))
        self.assertEqual(calls[2], ("ref_logits", ([ids[1]], 4, False)))
        self.assertEqual(len(ids), 3)

    def test_prompt_logprobs_come_from_one_pass_over_the_prompt_summed_over_ranks(self):
        import array
        import base64
        import math

        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.abstract import Executor as Base

        # every position's logits (3 prompt positions x vocab 4), per rank, flattened
        rank_rows = [[0.1, 0.2, 0.3, 0.4, 1.0, 0.0, 0.5, 0.2, 0.0, 0.0, 2.0, 0.1],
                     [0.4, 0.3, 0.2, 0.1, 0.0, 1.0, 0.5, 0.2, 0.3, 0.0, 0.0, 0.1]]
        calls = []

        class Executor(Base):
            def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
                calls.append((method, args))
                rows = rank_rows if args[2] else [r[-4:] for r in rank_rows]
                return [base64.b64encode(array.array("f", r).tobytes()).decode() for r in rows]

        core = EngineCore(Executor(), types.SimpleNamespace(device="cuda"))
        ids, logprobs, scored = core.generate([3, 1, 2], 1, True)
        self.assertEqual(calls, [("ref_logits", ([3, 1, 2], 0, True))])  # one forward pass
        total = [a + b for a, b in zip(*rank_rows)]

        def lsm(row, i):
            return row[i] - math.log(sum(math.exp(v) for v in row))

        # position 0 predicts prompt token 1 (id 1), position 1 predicts id 2; the last position the answer
        self.assertEqual(len(scored), 2)
        self.assertAlmostEqual(scored[0], lsm(total[0:4], 1), places=5)
        self.assertAlmostEqual(scored[1], lsm(total[4:8], 2), places=5)
        self.assertEqual(ids, [2])  # summed last row: 0.3, 0.0, 2.0, 0.2
        self.assertAlmostEqual(logprobs[0], lsm(total[8:12], 2), places=5)


if __name__ == "__main__":
    unittest.main()
