// The memory a binding is told to copy to or from ({ kind: 'host' | 'imported' | 'device' |
// 'buffer' | 'mapped', ... }), read on the JS thread and opened as a transfer::Region off it.
// Shared by the transfer job and the copy queue.
#pragma once

#include <napi.h>

#include <cstdint>
#include <memory>

#include "common/fd.h"
#include "transfer/region.h"

namespace vsnap::cuda {
class Mapping;
}
namespace vsnap::transfer {
class HostBuffer;
}

namespace vsnap::js {

struct MemorySpec {
  enum class Kind { None, Host, Imported, Device, Buffer, Mapped } kind = Kind::None;
  UniqueFd fd;  // our own duplicate, so the caller may close theirs at once
  std::shared_ptr<cuda::Mapping> mapping;
  std::shared_ptr<transfer::HostBuffer> buffer;
  std::shared_ptr<transfer::Region> mapped;  // a RegionSet's region: opened already, shared
  uint64_t offset = 0;

  // Builds the region (off the JS thread: importing maps device memory).
  std::unique_ptr<transfer::Region> open(uint64_t size) const;
};

// Reads a memory spec; undefined/null gives Kind::None. Throws a JS error for a bad one.
MemorySpec parseMemory(Napi::Env env, const Napi::Value& value);

}  // namespace vsnap::js
