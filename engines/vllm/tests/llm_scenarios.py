"""RL-framework-style scripts that drive the reference engine through vLLM's offline entry point
(`from vllm import LLM`), each run in a process of its own by test_llm_sleep.py, as a trainer
runs vLLM: `VLLM_PLUGINS=vsnap VSNAP_RAM_TIER=<dir> python3 -m tests.llm_scenarios <name>`,
the plugin found through its entry point. VLLM_ENABLE_V1_MULTIPROCESSING picks the engine
core's place (0: in this process, as RL frameworks run it; 1, vLLM's default: a background
process). Each prints one line `RESULT <json>` of what it saw; the test asserts on it."""

import json
import os
import sys

from tests import support  # noqa: F401 - the stand-in vllm package and the plugin on sys.path

PROMPT = "hello there"


class TrainerExtension:
    """An RL framework's own worker extension (`worker_extension_cls`): the trainer pushes its
    weights through it with collective_rpc, in place, as verl's or OpenRLHF's do. Here a seed
    stands for the trainer's tensors (the reference model's weights come from a seed)."""

    def trainer_load_weights(self, seed):
        self.model_runner.model.update_weights(int(seed))
        return True


def answer(llm):
    from vllm import SamplingParams

    return llm.generate(PROMPT, SamplingParams(max_tokens=6, temperature=0))[0].outputs[0].token_ids


def tier_state():
    from vsnap_vllm.ram_tier import RamTier

    path = os.environ["VSNAP_RAM_TIER"]
    return {"used": RamTier.open(path).used_bytes(), "holds": len(os.listdir(os.path.join(path, "holds")))}


def inprocess_allocator():
    """The allocator's view (only where the engine core runs in this process)."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return None
    from vllm.device_allocator import cumem

    datas = cumem.CuMemAllocator.get_instance().pointer_to_data.values()
    # None where the allocator does not say (vLLM's own cumem.py of e5337d96, with VSNAP_VLLM_SRC on the GPU)
    asleep = sorted({d.tag for d in datas if d.is_asleep}) if all(hasattr(d, "is_asleep") for d in datas) else None
    return {"asleep": asleep,
            "host_copies": sum(1 for d in datas if d.cpu_backup_tensor is not None),
            "weights_bytes": sum(d.handle[1] for d in datas if d.tag == "weights")}


def refused(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - reported to the test, which checks what it says
        return f"{type(e).__name__}: {e}"
    return None


def make(backend="vsnap", **kw):
    from vllm import LLM

    return LLM(enable_sleep_mode=True, sleep_mode_backend=backend, layers=2, **kw)


def levels(backend="vsnap"):
    """Level 1 woken at once and by tags, then level 2 refused until the tier holds the weights
    and accepted after."""
    llm, out = make(backend), {}
    out["backend"] = llm.collective_rpc("ref_sleep_mode_backend")
    out["expected"] = answer(llm)
    out["level2_first"] = refused(lambda: llm.sleep(level=2))
    out["after_refusal"] = {"allocator": inprocess_allocator(), "memory_asleep": llm.collective_rpc("ref_memory_asleep")}
    llm.wake_up()  # lifts the pause the refused sleep left
    out["answer_after_refusal"] = answer(llm)
    llm.sleep(level=1)
    out["slept1"] = {"sleeping": llm.llm_engine.is_sleeping(), "tier": tier_state(), "allocator": inprocess_allocator(),
                     "state": llm.collective_rpc("ref_sleep_mode_backend")[0]["state"]}
    llm.wake_up()
    out["woke1"] = {"answer": answer(llm), "tier": tier_state()}
    llm.sleep(level=1)
    llm.wake_up(tags=["weights"])
    out["woke_weights"] = {"sleeping": llm.llm_engine.is_sleeping(), "allocator": inprocess_allocator(),
                           "state": llm.collective_rpc("ref_sleep_mode_backend")[0]["state"]}
    llm.wake_up(tags=["kv_cache"])
    out["woke_kv"] = {"sleeping": llm.llm_engine.is_sleeping(), "answer": answer(llm)}
    out["level2"] = refused(lambda: llm.sleep(level=2))
    out["slept2"] = {"allocator": inprocess_allocator(), "tier": tier_state()}
    llm.wake_up(tags=["weights"])
    llm.wake_up(tags=["kv_cache"])
    out["woke2"] = {"answer": answer(llm), "weight_loads": llm.collective_rpc("ref_weight_loads"), "tier": tier_state()}
    llm.shutdown()
    return out


def full_tier():
    """A tier whose budget cannot hold the weights: level 2 refused with nothing released; level
    1 keeps vLLM's own host copy."""
    llm, out = make(), {}
    out["expected"] = answer(llm)
    out["level2"] = refused(lambda: llm.sleep(level=2))
    out["after_refusal"] = {"allocator": inprocess_allocator(), "memory_asleep": llm.collective_rpc("ref_memory_asleep")}
    llm.wake_up()
    out["answer_after_refusal"] = answer(llm)
    llm.sleep(level=1)
    out["slept1"] = {"allocator": inprocess_allocator(), "tier": tier_state()}
    llm.wake_up()
    out["woke1"] = answer(llm)
    llm.shutdown()
    return out


def rl_loop():
    """The RL loop: sleep at level 1 while the trainer steps, wake, push new weights (vLLM's
    weight-sync API one step, the trainer's own extension through collective_rpc the next), then
    sleep and wake again: the engine answers with the weights it slept with."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest

    llm, out = make(worker_extension_cls=f"{__name__}.TrainerExtension"), {}
    out["original"] = answer(llm)
    out["vsnap_methods"] = llm.collective_rpc("vsnap_status")[0].get("rank") is not None
    llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={"backend": "reference"}))
    steps = []
    for step, seed in enumerate((11, 12, 1)):
        llm.sleep(level=1)  # the trainer's step runs while the engine sleeps
        llm.wake_up(tags=["weights"])
        if step == 1:
            llm.collective_rpc("trainer_load_weights", args=(seed,))
        else:
            llm.start_weight_update()
            llm.update_weights(WeightTransferUpdateRequest(update_info={"seed": seed, "layers": None}))
            llm.finish_weight_update()
        llm.wake_up(tags=["kv_cache"])
        pushed = answer(llm)
        llm.sleep(level=1)
        llm.wake_up()
        steps.append({"pushed": pushed, "after_wake": answer(llm)})
    out["steps"] = steps
    out["tier"] = tier_state()
    llm.shutdown()
    return out


SCENARIOS = {"levels": levels, "levels_cumem": lambda: levels("cumem"), "full_tier": full_tier, "rl_loop": rl_loop}

if __name__ == "__main__":
    print("RESULT " + json.dumps(SCENARIOS[sys.argv[1]]()), flush=True)
