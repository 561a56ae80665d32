// The GPU digest ("vsnap-gd1"), shared verbatim by the CUDA kernel (digest_kernel.cu) and the
// host code (digest.cc), so both compute the same value by construction. src/digest/cpu.ts is
// a TypeScript port, checked against the same fixed vectors.
//
// A chunk of n bytes is read as little-endian 64-bit words w_j (the last one zero-padded),
// j = 0 .. ceil(n/8)-1. Each word is keyed by its position (t = j mod 2^32):
//   lo = low32(w) ^ (t * K1)        hi = high32(w) ^ (t * K2 + K3)        (mod 2^32)
//   A += lo * hi  (a full 32x32 -> 64-bit product)      B += hi:lo          (mod 2^64)
// and the digest is mix64(A + G * (n + 1)) : mix64(B ^ h1 ^ C), 128 bits as 32 hex digits.
// Sums mod 2^64 are exact and commutative, so any split of a chunk over threads, blocks or
// CPU loops gives the same bits; the kernel still reduces in one fixed order. B alone catches
// any change confined to one word; A (position-weighted products) catches moved or swapped
// words. It detects changes, it is not a cryptographic hash (XXH3-128 guards the stored bytes).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define VSNAP_DIGEST_FN __host__ __device__ __forceinline__
#else
#define VSNAP_DIGEST_FN inline
#endif

namespace vsnap_gd1 {

constexpr uint32_t kK1 = 0x9E3779B1u;
constexpr uint32_t kK2 = 0x85EBCA77u;
constexpr uint32_t kK3 = 0xC2B2AE3Du;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kFinal = 0xC2B2AE3D27D4EB4Full;

struct Acc {
  uint64_t a;
  uint64_t b;
};

// Absorbs word w, at word index t of its chunk.
VSNAP_DIGEST_FN void absorb(Acc& acc, uint64_t w, uint32_t t) {
  uint32_t lo = static_cast<uint32_t>(w) ^ (t * kK1);
  uint32_t hi = static_cast<uint32_t>(w >> 32) ^ (t * kK2 + kK3);
  acc.a += static_cast<uint64_t>(lo) * static_cast<uint64_t>(hi);
  acc.b += (static_cast<uint64_t>(hi) << 32) | lo;
}

VSNAP_DIGEST_FN void merge(Acc& into, const Acc& other) {
  into.a += other.a;
  into.b += other.b;
}

// The splitmix64 finaliser: full avalanche of 64 bits.
VSNAP_DIGEST_FN uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The digest of a chunk of `length` bytes whose words summed to acc: h[0] then h[1].
VSNAP_DIGEST_FN void finish(const Acc& acc, uint64_t length, uint64_t h[2]) {
  h[0] = mix64(acc.a + kGolden * (length + 1));
  h[1] = mix64(acc.b ^ h[0] ^ kFinal);
}

// The zero-padded little-endian word of the bytes p[0, count), count < 8 (a chunk's tail).
VSNAP_DIGEST_FN uint64_t tailWord(const unsigned char* p, uint32_t count) {
  uint64_t w = 0;
  for (uint32_t i = 0; i < count; i++) w |= static_cast<uint64_t>(p[i]) << (8 * i);
  return w;
}

}  // namespace vsnap_gd1
