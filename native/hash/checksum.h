// Chunk checksums: XXH3-128 from the xxHash library (libxxhash-dev, compiled in). On x86-64 the
// widest vector unit of this CPU is picked at run time (AVX-512, AVX2, else SSE2); on arm64 the
// baseline build uses NEON. Every implementation gives the same digests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace vsnap::hash {

constexpr const char* kAlgorithm = "xxh3-128";

struct Digest {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const Digest& o) const { return high == o.high && low == o.low; }
  bool operator!=(const Digest& o) const { return !(*this == o); }
  // 32 lowercase hex digits, high half first (the canonical XXH128 form xxhsum prints).
  std::string hex() const;
  // Parses hex(); throws E_INVALID_ARGUMENT on anything else.
  static Digest fromHex(const std::string& text);
};

// The instruction set in use: "avx512", "avx2", "sse2", "neon" or "scalar".
const char* implementation();

Digest digest(const void* data, size_t length);

// Incremental hashing, for data that arrives in pieces.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void reset();
  void update(const void* data, size_t length);
  Digest finish() const;

 private:
  void* state_;
};

// One implementation's entry points (one per instruction set, each in its own file).
struct Impl {
  const char* name;
  void* (*create)();
  void (*destroy)(void*);
  void (*reset)(void*);
  void (*update)(void*, const void*, size_t);
  Digest (*finish)(const void*);
  Digest (*oneShot)(const void*, size_t);
};
extern const Impl kBase;  // the architecture's baseline (checksum_base.cc)
#if defined(__x86_64__)
extern const Impl kAvx2;
extern const Impl kAvx512;
#endif

}  // namespace vsnap::hash
