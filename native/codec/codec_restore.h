// A restore from chunks held coded in pinned host memory (the RAM tier) into device memory: each
// coded chunk crosses the link into one of two device scratch slots on a copy stream, and the
// decode kernel writes it from there into the target on a decode stream while the next chunk
// crosses (events between the two streams); chunks held raw are copied straight into the target.
// Every coded chunk's header and tables are checked on the host before anything is issued.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transfer/region.h"

namespace vsnap::codec {

// One chunk of a target: `held` bytes at `at` in the host memory, `rawSize` decoded bytes at
// `dstOffset` in the target; `coded` a vsnap-c1 chunk, else the raw bytes themselves.
struct HeldChunk {
  uint64_t at = 0, held = 0, rawSize = 0, dstOffset = 0;
  bool coded = false;
};

struct HeldTarget {
  std::unique_ptr<transfer::Region> region;  // device memory (deviceMapping() non-null)
  std::vector<HeldChunk> chunks;
};

struct HeldRestoreResult {
  double seconds = 0;
  uint64_t rawBytes = 0;      // decoded bytes written
  uint64_t linkBytes = 0;     // bytes that crossed the link
  uint64_t scratchBytes = 0;  // device scratch used on each GPU (two slots and the error words)
};

// Throws E_CODEC_CORRUPT with details reason, target (index) and chunk (index in its target):
// before anything is issued for a header or table that does not hold, after the streams are done
// for a block the kernel found inconsistent (the target then holds the bad chunk's bytes: the
// caller's digest check and its refusal to wake the engine cover that).
HeldRestoreResult restoreHeld(const char* host, std::vector<HeldTarget>& targets);

}  // namespace vsnap::codec
