// HostBuffer: a large block of host memory, faulted in and page-locked once, that the RAM tier
// (HostCache) carves snapshots into. Regions inside it can be hydrated into (cache fill) and
// copied from straight to a GPU (restore from RAM), without staging.
#pragma once

#include <cstdint>
#include <memory>

#include "transfer/region.h"

namespace vsnap::cuda {
class HostRegistration;
}

namespace vsnap::transfer {

class HostBuffer {
 public:
  // pinDevice: the GPU whose context holds the registration (portable to all GPUs), or -1 for
  // plain host memory.
  HostBuffer(uint64_t size, int pinDevice);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint64_t size() const { return size_; }
  bool pinned() const { return registration_ != nullptr; }
  char* data() const { return static_cast<char*>(base_); }

 private:
  uint64_t size_;
  void* base_ = nullptr;
  std::unique_ptr<cuda::HostRegistration> registration_;
};

// Marks page-locked host memory MADV_DONTFORK: a child process (any spawn: an engine, a helper,
// nvidia-smi) does not inherit it. Without it, fork() of a process holding pinned pages copies
// every one of them into the child (Linux copies DMA-pinned anonymous pages at fork rather than
// share them copy-on-write): seconds per 10 GiB with the caller's thread blocked, and as much
// memory again until the child execs.
void keepFromChildren(void* base, uint64_t size);

// [offset, offset + size) of a buffer, as a region (kept alive by the shared pointer).
std::unique_ptr<Region> bufferRegion(std::shared_ptr<HostBuffer> buffer, uint64_t offset, uint64_t size);

}  // namespace vsnap::transfer
