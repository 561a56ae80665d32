"""vsnap-gd1, the SDK's GPU digest, computed here in the engine over its own weights memory.

The SDK's dirty check before a suspend compares the live weights with the snapshot's digests.
Reading them from the SDK's process means exporting every allocation, importing and mapping it
there (per-region driver work that grows with the region count); digesting them here, where they
are mapped already, needs none of it. The function is the one in vsnap's native/digest/digest_mix.h
(and src/digest/cpu.ts): a chunk of n bytes is read as little-endian 64-bit words w_j (the last
zero-padded), each keyed by its index t = j mod 2^32 in the chunk:

    lo = low32(w) ^ (t * K1)     hi = high32(w) ^ (t * K2 + K3)      (mod 2^32)
    A += lo * hi (64-bit product)      B += hi:lo                       (mod 2^64)
    h0 = mix64(A + G * (n + 1))      h1 = mix64(B ^ h0 ^ F)           digest = h0:h1, 32 hex digits

On the GPU the sums come from vsnap's own kernel (digest_kernel.fatbin, the bytes of
native/digest/digest_kernel.inc, run by drivers.CudaDriver.digest_many); on host memory (the CPU
test engine) from numpy, which vLLM always brings. Sums mod 2^64 are order-free, so both give the
SDK's bits.
"""

import ctypes
import os

K1, K2, K3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
GOLDEN, FINAL = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1

# The largest chunk the kernel and the SDK accept (native/digest/digest.cc checkChunking).
MAX_CHUNK = 1 << 30
# The kernel's launch shape (native/digest/digest.cc): 256 threads a block, 1 MiB of a chunk a block.
THREADS = 256
SPAN_BYTES = 1 << 20

FATBIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digest_kernel.fatbin")


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def finish(a, b, length):
    """The digest (32 hex digits) of a chunk of `length` bytes whose words summed to (a, b)."""
    h0 = mix64((a + GOLDEN * (length + 1)) & MASK64)
    h1 = mix64((b ^ h0 ^ FINAL) & MASK64)
    return f"{h0:016x}{h1:016x}"


def check_chunk_size(chunk_size):
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size <= 0 or chunk_size % 16 or chunk_size > MAX_CHUNK:
        raise ValueError(f"chunkSize must be a positive multiple of 16 up to 1 GiB, not {chunk_size!r}")


def chunk_lengths(size, chunk_size):
    """The lengths of the chunks a region of `size` bytes is digested in."""
    return [min(chunk_size, size - at) for at in range(0, size, chunk_size)]


class SpanDesc(ctypes.Structure):
    """One region of a vsnap_digest_spans launch (digest_kernel.cu's DigestSpanDesc): its blocks
    are first_block .. first_block + chunks * blocks_per_chunk - 1."""

    _fields_ = [("base", ctypes.c_uint64), ("size", ctypes.c_uint64), ("chunk_size", ctypes.c_uint64),
                ("first_block", ctypes.c_uint64), ("blocks_per_chunk", ctypes.c_uint64)]


def span_table(spans, chunk_size):
    """The launch plan of `spans` ((va, size) pairs) in one vsnap_digest_spans launch: per span
    (size, blocks a chunk, blocks), the table of the spans that have blocks (a ctypes array), and
    the blocks in all. A span shorter than a chunk gets only the blocks its bytes need, as
    native/digest/digest.cc plans them."""
    plans, rows, first = [], [], 0
    for va, size in spans:
        per_chunk = -(-min(chunk_size, size) // SPAN_BYTES)
        n = -(-size // chunk_size) * per_chunk
        plans.append((size, per_chunk, n))
        if n:
            rows.append((va, size, chunk_size, first, per_chunk))
        first += n
    return plans, (SpanDesc * len(rows))(*rows), first


# ---------------------------------------------------------------------------- host memory

def numpy_available():
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


_SLICE_WORDS = 1 << 20  # 8 MiB of words at a time: bounded temporaries whatever the chunk


def _sums(words, first_index):
    """(A, B) mod 2^64 of the uint64 array `words`, whose first word has index `first_index`."""
    import numpy as np

    t = (np.arange(first_index, first_index + words.size, dtype=np.uint64) & np.uint64(MASK32)).astype(np.uint32)
    lo = (words & np.uint64(MASK32)).astype(np.uint32) ^ (t * np.uint32(K1))
    hi = (words >> np.uint64(32)).astype(np.uint32) ^ (t * np.uint32(K2) + np.uint32(K3))
    lo64, hi64 = lo.astype(np.uint64), hi.astype(np.uint64)
    a = int(np.sum(lo64 * hi64, dtype=np.uint64))
    b = int(np.sum((hi64 << np.uint64(32)) | lo64, dtype=np.uint64))
    return a, b


def digest_bytes(data, chunk_size):
    """The digests of a bytes-like object, chunk by chunk (numpy: vLLM's environment has it)."""
    import numpy as np

    check_chunk_size(chunk_size)
    view = memoryview(data).cast("B")
    out = []
    for at in range(0, len(view), chunk_size):
        n = min(chunk_size, len(view) - at)
        full = n // 8
        a = b = 0
        for first in range(0, full, _SLICE_WORDS):
            count = min(_SLICE_WORDS, full - first)
            words = np.frombuffer(view[at + first * 8: at + (first + count) * 8], dtype="<u8")
            sa, sb = _sums(words, first)
            a, b = (a + sa) & MASK64, (b + sb) & MASK64
        if n % 8:
            tail = int.from_bytes(bytes(view[at + full * 8: at + n]), "little")
            sa, sb = _sums(np.array([tail], dtype=np.uint64), full)
            a, b = (a + sa) & MASK64, (b + sb) & MASK64
        out.append(finish(a, b, n))
    return out


def digest_host(va, size, chunk_size):
    """The digests of `size` bytes of this process's memory at address `va`."""
    if size == 0:
        return []
    return digest_bytes((ctypes.c_ubyte * size).from_address(va), chunk_size)


def partials_buffer(count):
    """Host memory for `count` partial sums of the kernel: a numpy uint64 array (vLLM brings
    numpy), else a ctypes array."""
    try:
        import numpy as np
    except ImportError:
        return (ctypes.c_uint64 * count)()
    return np.empty(count, dtype=np.uint64)


def buffer_address(buffer):
    """The address of a partials_buffer's memory."""
    data = getattr(buffer, "ctypes", None)
    return data.data if data is not None else ctypes.addressof(buffer)


def finish_partials(partials, size, chunk_size, blocks_per_chunk):
    """The digests of a region from the kernel's partial sums: a pair (A, B) per block, the blocks
    of chunk c being c * blocks_per_chunk ... (c + 1) * blocks_per_chunk - 1 (a numpy array, a
    ctypes array or a list)."""
    lengths = chunk_lengths(size, chunk_size)
    reshape = getattr(partials, "reshape", None)
    if reshape is not None:  # numpy: every chunk's sums at once (uint64 sums wrap mod 2^64)
        import numpy as np

        sums = reshape(len(lengths), blocks_per_chunk, 2).sum(axis=1, dtype=np.uint64)
        return [finish(int(a), int(b), n) for (a, b), n in zip(sums.tolist(), lengths)]
    out = []
    for c, n in enumerate(lengths):
        base = 2 * c * blocks_per_chunk
        a = sum(partials[base: base + 2 * blocks_per_chunk: 2]) & MASK64
        b = sum(partials[base + 1: base + 2 * blocks_per_chunk: 2]) & MASK64
        out.append(finish(a, b, n))
    return out
