"""vsnap-gd1 computed in the engine (vsnap_vllm/gd1.py): the SDK's fixed vectors
(test/unit/digest.test.ts), awkward sizes against a big-integer transcription of the spec, the
host driver over memory mapped at an address, and the kernel's partial sums finished the way
the SDK finishes them."""

import ctypes
import os
import random
import unittest

from vsnap_vllm import gd1
from vsnap_vllm.drivers import CudaDriver, DriverError, HostDriver

SEQ = bytes(((i * 31 + 7) & 255) for i in range(10000))
VECTORS = [
    ("empty", b"", 4096, []),
    ('"abc"', b"abc", 4096, ["9841fda9a538111b2f37debfe753d396"]),
    ("one byte 0x01", bytes([1]), 4096, ["be061f5ba7f487d7647f270c96ff8732"]),
    ("8 KiB of zeros", bytes(8192), 4096, ["591fe4b9b42278c806d211eba34c91ee"] * 2),
    ("10000 sequence bytes", SEQ, 4096, ["ac1a4f2ae8e0b8c672b526e37bfe587d"] * 2 + ["16e05f28a738a3c034c65bb149463ae6"]),
]


def spec_sums(chunk):
    """The header's comment, word by word, in Python integers: (A, B) mod 2^64."""
    return spec_sums_at(chunk, 0)


def spec_sums_at(piece, first_word):
    """spec_sums of a slice that starts at word `first_word` of its chunk."""
    a = b = 0
    for j in range(0, len(piece), 8):
        w = int.from_bytes(piece[j:j + 8], "little")
        t = (first_word + j // 8) & gd1.MASK32
        lo = (w & gd1.MASK32) ^ ((t * gd1.K1) & gd1.MASK32)
        hi = (w >> 32) ^ ((t * gd1.K2 + gd1.K3) & gd1.MASK32)
        a = (a + lo * hi) & gd1.MASK64
        b = (b + ((hi << 32) | lo)) & gd1.MASK64
    return a, b


@unittest.skipUnless(gd1.numpy_available(), "needs numpy (vLLM brings it; .ci/run installs it)")
class Gd1Test(unittest.TestCase):
    def test_the_sdks_fixed_vectors(self):
        for name, data, chunk, expected in VECTORS:
            with self.subTest(name):
                self.assertEqual(gd1.digest_bytes(data, chunk), expected)

    def test_awkward_sizes_match_the_spec_word_by_word(self):
        rng = random.Random(7)
        for size in (1, 7, 8, 9, 15, 16, 17, 31, 4095, 4097, 12289):
            data = bytes(rng.getrandbits(8) for _ in range(size))
            expected = [gd1.finish(*spec_sums(data[at:at + 4096]), len(data[at:at + 4096])) for at in range(0, size, 4096)]
            self.assertEqual(gd1.digest_bytes(data, 4096), expected, f"size {size}")

    def test_words_past_one_slice_keep_their_index(self):
        # More words than one numpy slice: the second slice's words are keyed from where it starts.
        saved, gd1._SLICE_WORDS = gd1._SLICE_WORDS, 64
        try:
            data = os.urandom(64 * 8 * 3 + 5)
            expected = [gd1.finish(*spec_sums(data), len(data))]
            self.assertEqual(gd1.digest_bytes(data, 1 << 20), expected)
        finally:
            gd1._SLICE_WORDS = saved

    def test_kernel_partials_finish_per_chunk(self):
        # Two chunks of 3 blocks each: a chunk's (A, B) is the sum of its blocks' pairs, in any split.
        data = os.urandom(5000)
        chunks = [data[:4096], data[4096:]]
        partials = []
        for c in chunks:
            a, b = spec_sums(c)
            parts = [(a // 3, b // 3), (a // 3, b // 3), (a - 2 * (a // 3), b - 2 * (b // 3))]
            for pa, pb in parts:
                partials += [pa, pb]
        self.assertEqual(gd1.finish_partials(partials, len(data), 4096, 3), gd1.digest_bytes(data, 4096))
        # The same from the numpy buffer the CUDA driver fetches the sums into (sums wrap mod 2^64).
        buffer = gd1.partials_buffer(len(partials))
        buffer[:] = partials
        self.assertEqual(gd1.finish_partials(buffer, len(data), 4096, 3), gd1.digest_bytes(data, 4096))
        wrapped = gd1.partials_buffer(4)
        wrapped[:] = [gd1.MASK64, gd1.MASK64, 2, 3]
        self.assertEqual(gd1.finish_partials(wrapped, 16, 4096, 2), [gd1.finish(1, 2, 16)])

    def test_span_table_plans_one_launch_as_the_kernel_reads_it(self):
        # The vsnap_digest_spans launch on the CPU: each block finds its region in the table (the
        # last whose first block <= it, as the kernel searches), digests its slice of its chunk;
        # the plans then finish every region as digest_bytes does, empty regions included.
        saved = gd1.SPAN_BYTES
        gd1.SPAN_BYTES = 4096  # small slices, so a chunk spans several blocks
        try:
            rng = random.Random(7)
            sizes = [0, 13, 4096 + 8, 3 * 4096, 0, 5 * 4096 + 40, 16, 9000]
            data = [bytes(rng.getrandbits(8) for _ in range(n)) for n in sizes]
            for chunk in (4096, 8192, 1 << 20):
                spans = [(1000 * (i + 1), n) for i, n in enumerate(sizes)]
                plans, table, blocks = gd1.span_table(spans, chunk)
                self.assertEqual(len(table), sum(1 for n in sizes if n))
                self.assertEqual(blocks, sum(p[2] for p in plans))
                by_base = {va: d for (va, _), d in zip(spans, data)}
                partials = []
                for b in range(blocks):
                    lo, hi = 0, len(table)
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        lo, hi = (mid, hi) if table[mid].first_block <= b else (lo, mid)
                    row = table[lo]
                    local = b - row.first_block
                    chunk_at = (local // row.blocks_per_chunk) * row.chunk_size
                    chunk_len = min(row.chunk_size, row.size - chunk_at)
                    begin = min((local % row.blocks_per_chunk) * gd1.SPAN_BYTES, chunk_len)
                    end = min(begin + gd1.SPAN_BYTES, chunk_len)
                    piece = by_base[row.base][chunk_at:chunk_at + chunk_len]
                    a, bb = spec_sums_at(piece[begin:end], begin // 8)
                    partials += [a, bb]
                at = 0
                for (size, per_chunk, n), d in zip(plans, data):
                    got = gd1.finish_partials(partials[2 * at: 2 * (at + n)], size, chunk, per_chunk) if n else []
                    self.assertEqual(got, gd1.digest_bytes(d, chunk), f"{size} bytes in chunks of {chunk}")
                    at += n
        finally:
            gd1.SPAN_BYTES = saved

    def test_refuses_chunk_sizes_the_sdk_refuses(self):
        for bad in (0, -16, 24, 1 << 31, 4096.0, True):
            with self.assertRaises(ValueError, msg=repr(bad)):
                gd1.check_chunk_size(bad)

    def test_host_driver_digests_memory_mapped_at_an_address(self):
        driver = HostDriver()
        size = 3 * 4096 + 24
        va = driver.reserve(0, 4 * 4096)
        fd = driver.create_exportable(0, 4 * 4096)
        try:
            driver.map(0, va, 4 * 4096, fd)
            data = os.urandom(size)
            ctypes.memmove(va, data, size)
            self.assertTrue(driver.can_digest())
            got = driver.digest_many(0, [(va, size), (va + 4096, 4096), (va, 0)], 4096)
            self.assertEqual(got, [gd1.digest_bytes(data, 4096), gd1.digest_bytes(data[4096:8192], 4096), []])
            driver.unmap(0, va, 4 * 4096)
        finally:
            driver.release(0, fd)
            driver.free_address(0, va, 4 * 4096)

    def test_the_kernel_image_ships_with_the_plugin(self):
        # The SDK's test checks it is the bytes of native/digest/digest_kernel.inc.
        with open(gd1.FATBIN, "rb") as f:
            self.assertEqual(f.read(4), bytes([0x50, 0xED, 0x55, 0xBA]))  # the fatbin magic


def _cuda():
    """(torch, a CudaDriver) where a GPU and torch are here (the GPU machine), else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    try:
        return torch, CudaDriver()
    except DriverError:
        return None


@unittest.skipUnless(_cuda(), "needs an NVIDIA GPU and torch (run on the GPU machine: python3 -m unittest tests.test_gd1)")
class CudaDigestTest(unittest.TestCase):
    """The kernel run from here (drivers.CudaDriver.digest_many) against the same bytes digested
    on the host: device memory of awkward sizes, several regions in one batch."""

    def test_the_kernel_gives_the_host_digests(self):
        torch, driver = _cuda()
        torch.cuda.init()
        gen = torch.Generator(device="cuda").manual_seed(3)
        sizes = [1, 24, 4096 + 8, (1 << 20) + 40, 3 * (4 << 20) + 16, 64 << 20]
        tensors = [torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen) for n in sizes]
        torch.cuda.synchronize()
        for chunk in (4096, 1 << 20, 16 << 20):
            got = driver.digest_many(0, [(t.data_ptr(), t.numel()) for t in tensors], chunk)
            for t, digests in zip(tensors, got):
                self.assertEqual(digests, gd1.digest_bytes(t.cpu().numpy().tobytes(), chunk), f"{t.numel()} bytes in chunks of {chunk}")
        self.assertEqual(driver.digest_many(0, [], 4096), [])

    def test_the_same_spans_again_read_the_memory_as_it_is_now(self):
        # the launches of a set of spans are built once and the scratch kept: a second call must
        # still digest the bytes there now, and a larger set must get a larger scratch
        torch, driver = _cuda()
        torch.cuda.init()
        gen = torch.Generator(device="cuda").manual_seed(4)
        small = [torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen) for n in (4096, (1 << 20) + 8)]
        spans = [(t.data_ptr(), t.numel()) for t in small]
        for _ in range(2):
            self.assertEqual(driver.digest_many(0, spans, 4096), [gd1.digest_bytes(t.cpu().numpy().tobytes(), 4096) for t in small])
        small[1].add_(1)
        torch.cuda.synchronize()
        self.assertEqual(driver.digest_many(0, spans, 4096), [gd1.digest_bytes(t.cpu().numpy().tobytes(), 4096) for t in small])
        large = torch.randint(0, 256, (32 << 20,), dtype=torch.uint8, device="cuda", generator=gen)
        torch.cuda.synchronize()
        self.assertEqual(driver.digest_many(0, [(large.data_ptr(), large.numel())] + spans, 4096),
                         [gd1.digest_bytes(large.cpu().numpy().tobytes(), 4096)] + [gd1.digest_bytes(t.cpu().numpy().tobytes(), 4096) for t in small])
        self.assertEqual(driver.digest_many(0, spans, 4096), [gd1.digest_bytes(t.cpu().numpy().tobytes(), 4096) for t in small])

    def test_digest_start_returns_while_the_kernels_run_and_finish_gives_the_digests(self):
        # the export with digests launches the kernels, makes the descriptors, then finishes:
        # the bytes read are those at the launch, and a later digest of other spans is unaffected
        torch, driver = _cuda()
        torch.cuda.init()
        gen = torch.Generator(device="cuda").manual_seed(5)
        tensors = [torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen) for n in (4096, 3 << 20, 64 << 20)]
        torch.cuda.synchronize()
        expected = [gd1.digest_bytes(t.cpu().numpy().tobytes(), 1 << 20) for t in tensors]
        finish = driver.digest_start(0, [(t.data_ptr(), t.numel()) for t in tensors], 1 << 20)
        other = driver.digest_many(0, [(tensors[0].data_ptr(), tensors[0].numel())], 4096)  # same stream, after the first launches
        self.assertEqual(other, [gd1.digest_bytes(tensors[0].cpu().numpy().tobytes(), 4096)])
        self.assertEqual(finish(), expected)

    def test_a_restore_copies_host_bytes_in_and_digests_what_landed(self):
        # the vsnap sleep backend's wake: copies from host memory (page-locked, then pageable) and
        # the digest behind them on one stream, waited for once
        torch, driver = _cuda()
        torch.cuda.init()
        sizes = [4096, (1 << 20) + 8, 3 * (4 << 20) + 16]
        for lock in (True, False):
            hosts = [ctypes.create_string_buffer(os.urandom(n), n) for n in sizes]
            locked = [lock and driver.host_register(0, ctypes.addressof(h), n) for h, n in zip(hosts, sizes)]
            try:
                tensors = [torch.zeros(n, dtype=torch.uint8, device="cuda") for n in sizes]
                torch.cuda.synchronize()
                finish = driver.restore_start(0, [(t.data_ptr(), ctypes.addressof(h), n) for t, h, n in zip(tensors, hosts, sizes)], 1 << 20)
                got = finish()
                for t, h, digests in zip(tensors, hosts, got):
                    self.assertEqual(t.cpu().numpy().tobytes(), h.raw, f"locked {lock}")
                    self.assertEqual(digests, gd1.digest_bytes(h.raw, 1 << 20), f"locked {lock}")
            finally:
                for h, was in zip(hosts, locked):
                    if was:
                        driver.host_unregister(0, ctypes.addressof(h))


if __name__ == "__main__":
    unittest.main()
