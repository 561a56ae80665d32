// A capture into the RAM tier coded on the GPU: each chunk of a device region is encoded on its GPU
// into one of two device scratch slots on an encode stream, and its coded bytes (or, for a chunk
// that does not shrink, the raw bytes straight from the region) cross the link into pinned host
// memory on a copy stream while the next chunk is encoded (events between the two streams). The
// bytes written are those of the CPU encoder, packed 16-byte aligned from a start offset.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transfer/region.h"

namespace vsnap::codec {

// A region to capture: device memory (deviceMapping() non-null), cut into chunks of chunkSize.
struct CaptureSource {
  std::unique_ptr<transfer::Region> region;
  uint64_t chunkSize = 0;
  uint32_t hintKind = 0;  // vsnap_c1::Kind, 0 for none
};

// Where one chunk landed: `held` bytes at `at` in the host memory; a vsnap-c1 chunk when coded,
// else the raw bytes without a header (as the RAM tier holds them).
struct CapturedChunk {
  uint64_t at = 0, held = 0, rawSize = 0;
  bool coded = false;
};

struct CaptureHeldResult {
  double seconds = 0;
  uint64_t rawBytes = 0;      // bytes of the regions
  uint64_t linkBytes = 0;     // bytes that crossed the link
  uint64_t scratchBytes = 0;  // device scratch used on each GPU (two slots and the encoder's work area)
  uint64_t end = 0;           // the offset after the last chunk written
  std::vector<std::vector<CapturedChunk>> chunks;  // per source, in chunk order
};

// Writes every source's chunks into host[begin, limit), each 16-byte aligned, in source order.
// Throws E_INVALID_ARGUMENT for a source not in device memory or a bad chunk size, and E_INTERNAL
// when the chunks would pass `limit` (the caller reserves the raw size, which they never pass).
CaptureHeldResult captureHeld(char* host, uint64_t begin, uint64_t limit, std::vector<CaptureSource>& sources);

}  // namespace vsnap::codec
