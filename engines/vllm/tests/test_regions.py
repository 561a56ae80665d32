import unittest

from tests import support  # noqa: F401
from vsnap_vllm.adapter import Allocation
from vsnap_vllm.regions import describe


class FakeTensor:
    def __init__(self, ptr, dtype="torch.bfloat16", shape=(2, 3)):
        self.ptr, self.dtype, self.shape = ptr, dtype, shape

    def data_ptr(self):
        return self.ptr


class FakeModel:
    def __init__(self, params, buffers=()):
        self.params, self.buffers = params, buffers

    def named_parameters(self):
        return iter(self.params)

    def named_buffers(self):
        return iter(self.buffers)


def alloc(va, size):
    return Allocation(device=0, size=size, va=va, handle_slot=0, tag="weights")


class DescribeTest(unittest.TestCase):
    def test_keys_are_the_lowest_offset_tensor_else_anon_in_address_order(self):
        allocations = [alloc(0x9000, 0x1000), alloc(0x1000, 0x1000), alloc(0x5000, 0x1000), alloc(0x7000, 0x1000)]
        model = FakeModel(
            [("b.weight", FakeTensor(0x1100)), ("a.weight", FakeTensor(0x1000)), ("outside", FakeTensor(0x3000)), ("c", FakeTensor(0x9800, "torch.float16", (4,)))],
            [("rope.inv_freq", FakeTensor(0x7010, "torch.float32", (8,)))],
        )
        regions = describe(allocations, model)
        self.assertEqual([r["va"] for r in regions], [0x1000, 0x5000, 0x7000, 0x9000])
        self.assertEqual([r["key"] for r in regions], ["a.weight", "anon:0", "rope.inv_freq", "c"])
        self.assertEqual(regions[0]["tensors"], [
            {"name": "a.weight", "offset": 0, "dtype": "bfloat16", "shape": [2, 3]},
            {"name": "b.weight", "offset": 0x100, "dtype": "bfloat16", "shape": [2, 3]},
        ])
        self.assertEqual(regions[3]["tensors"][0]["dtype"], "float16")

    def test_regions_the_wake_writes_hold_a_buffer_or_no_tensor_of_the_model(self):
        # vLLM's level-2 wake copies the model's named buffers back (gpu_worker.py `wake_up`); a
        # region with no tensor of the model may hold a draft model's, saved the same way.
        allocations = [alloc(0x1000, 0x1000), alloc(0x2000, 0x1000), alloc(0x3000, 0x1000)]
        model = FakeModel([("w", FakeTensor(0x1000)), ("x", FakeTensor(0x2000))], [("rope.inv_freq", FakeTensor(0x2800, "torch.float32", (8,)))])
        self.assertEqual([(r["key"], r["wakeWrites"]) for r in describe(allocations, model)], [("w", False), ("x", True), ("anon:0", True)])

    def test_order_of_discovery_does_not_change_keys(self):
        allocations = [alloc(0x1000, 0x1000), alloc(0x2000, 0x1000)]
        forward = describe(allocations, FakeModel([("x", FakeTensor(0x1000)), ("y", FakeTensor(0x2000))]))
        backward = describe(list(reversed(allocations)), FakeModel([("y", FakeTensor(0x2000)), ("x", FakeTensor(0x1000))]))
        self.assertEqual(forward, backward)

    def test_without_a_model_every_region_is_anonymous(self):
        self.assertEqual([r["key"] for r in describe([alloc(0x2000, 16), alloc(0x1000, 16)], None)], ["anon:0", "anon:1"])


if __name__ == "__main__":
    unittest.main()
