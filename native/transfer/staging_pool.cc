#include "transfer/staging_pool.h"

#include <sys/mman.h>

#include <cerrno>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/stream.h"
#include "transfer/host_buffer.h"

namespace vsnap::transfer {

StagingPool::StagingPool(uint64_t slotSize, uint32_t slotCount, int pinDevice)
    : slotSize_(slotSize), slotCount_(slotCount) {
  if (slotSize == 0 || slotSize % 4096 != 0) throwInvalid("staging slot size must be a positive multiple of 4096");
  if (slotCount < 2) throwInvalid("a staging pool needs at least 2 slots");
  uint64_t total = slotSize * slotCount;
  base_ = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throwSystemError("mmap", "staging pool of " + std::to_string(total) + " bytes", errno);
  }
  madvise(base_, total, MADV_HUGEPAGE);  // fewer TLB misses for the DMA engine and for memcpy
  keepFromChildren(base_, total);
  try {
    if (pinDevice >= 0) registration_ = std::make_unique<cuda::HostRegistration>(cuda::acquireContext(pinDevice), base_, total);
  } catch (...) {
    munmap(base_, total);
    throw;
  }
  for (uint32_t i = 0; i < slotCount; i++) free_.push_back(static_cast<char*>(base_) + i * slotSize);
}

StagingPool::~StagingPool() {
  registration_.reset();
  if (base_) munmap(base_, slotSize_ * slotCount_);
}

uint32_t StagingPool::freeSlots() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint32_t>(free_.size());
}

void StagingPool::release(const std::vector<void*>& slots) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.insert(free_.end(), slots.begin(), slots.end());
  }
  freed_.notify_all();
}

}  // namespace vsnap::transfer
