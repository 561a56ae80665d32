// Per-chunk digests of a region ("vsnap-gd1", digest_mix.h): on the CPU for host memory, and
// with the embedded kernel on the GPU for device memory (ours or another process's, imported).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "digest/digest_mix.h"

namespace vsnap::cuda {
class Context;
}

namespace vsnap::digest {

struct Hash128 {
  uint64_t h[2];
  std::string hex() const;  // 32 lowercase hex digits, h[0] first
};

// The digests of host memory [data, data + size), one per chunkSize bytes.
std::vector<Hash128> digestHost(const unsigned char* data, uint64_t size, uint64_t chunkSize);

// One chunk's digest from its bytes, in one piece (digestHost) or in several in order (every
// piece but the last a multiple of 8 bytes), so a pass can read each piece once for several
// purposes (persisting: XXH3 and this digest from the same cache lines).
class ChunkDigester {
 public:
  void update(const unsigned char* p, uint64_t length);
  Hash128 finish() const;
  void reset();

 private:
  vsnap_gd1::Acc acc_{0, 0};
  uint64_t length_ = 0;
};

// Device memory [address, address + size) of one context; address 16-byte aligned.
struct DeviceSpan {
  uint64_t address;
  uint64_t size;
  uint64_t chunkSize;  // a multiple of 16
};

// The digests of each span, per chunk (one launch for all the spans, one stream, one wait). kernelMs,
// when given, gets the time of all the kernels.
std::vector<std::vector<Hash128>> digestDevice(const std::shared_ptr<cuda::Context>& ctx, const std::vector<DeviceSpan>& spans,
                                               float* kernelMs = nullptr);

// Bench: `repeats` timings (CUDA events, ms) of the digest kernel over [src, +size) and of a
// device-to-device copy of the same bytes into dst, interleaved, on one stream.
struct BenchTimes {
  std::vector<float> digestMs;
  std::vector<float> copyMs;
};
BenchTimes benchDevice(const std::shared_ptr<cuda::Context>& ctx, uint64_t src, uint64_t dst, uint64_t size,
                       uint64_t chunkSize, int repeats);

}  // namespace vsnap::digest
