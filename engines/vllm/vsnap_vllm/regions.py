"""Describing a worker's weights regions: address, size, tag, the tensors inside, and a key
that is the same in every process that loads the same model (so snapshots match by key, not
by address or order): the lowest-offset named parameter or buffer in the region, else
`anon:N`, N counting unnamed regions in address order. Each region also says whether vLLM's own
wake writes into it (`wakeWrites`): a level-2 sleep saves the model's named buffers to the host and
the wake copies them back (vllm/v1/worker/gpu_worker.py `sleep` / `wake_up`, `_sleep_saved_buffers`),
and a region with no tensor of the model may hold another model's (a draft model's, whose buffers
newer versions save the same way)."""

import bisect


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def named_tensors(model):
    """(name, tensor, is_buffer) for every named parameter, then every named buffer."""
    seen = set()
    for getter in ("named_parameters", "named_buffers"):
        fn = getattr(model, getter, None)
        if not callable(fn):
            continue
        for name, tensor in fn():
            if name in seen or tensor is None:
                continue
            seen.add(name)
            yield name, tensor, getter == "named_buffers"


def describe(allocations, model):
    """One dict per allocation (in address order): va, size, tag, key, tensors, wakeWrites."""
    regions = [{"va": a.va, "size": a.size, "tag": a.tag, "tensors": [], "buffers": False} for a in sorted(allocations, key=lambda a: a.va)]
    starts = [r["va"] for r in regions]
    if model is not None:
        for name, tensor, is_buffer in named_tensors(model):
            try:
                ptr = int(tensor.data_ptr())
            except (AttributeError, RuntimeError):
                continue
            if ptr == 0:
                continue
            i = bisect.bisect_right(starts, ptr) - 1
            if i < 0:
                continue
            region = regions[i]
            if ptr >= region["va"] + region["size"]:
                continue
            region["buffers"] = region["buffers"] or is_buffer
            region["tensors"].append({
                "name": name,
                "offset": ptr - region["va"],
                "dtype": _dtype_name(getattr(tensor, "dtype", "unknown")),
                "shape": [int(x) for x in getattr(tensor, "shape", ())],
            })
    anon = 0
    for region in regions:
        region["wakeWrites"] = region.pop("buffers") or not region["tensors"]
        region["tensors"].sort(key=lambda t: (t["offset"], t["name"]))
        if region["tensors"]:
            region["key"] = region["tensors"][0]["name"]
        else:
            region["key"] = f"anon:{anon}"
            anon += 1
    return regions
