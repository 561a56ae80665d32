#include "cuda/vmm_alloc_set.h"

#include "common/error.h"
#include "common/fault.h"
#include "cuda/context.h"
#include "cuda/devices.h"
#include "cuda/driver.h"
#include "cuda/exportable.h"
#include "cuda/vmm.h"
#include "cuda/vmm_batch.h"
#include "cuda/vmm_timing.h"

namespace vsnap::cuda {

namespace {
[[noreturn]] void injected(const char* step) {
  throw NativeError("E_CUDA", std::string("injected fault: ") + step + " of a device allocation set");
}
}  // namespace

std::shared_ptr<AllocationSet> AllocationSet::allocate(int device, const std::vector<uint64_t>& sizes) {
  if (sizes.empty()) throwInvalid("a device allocation set needs at least one region");
  for (uint64_t s : sizes) {
    if (s == 0) throwInvalid("device allocation size must be > 0");
  }
  std::shared_ptr<AllocationSet> set(new AllocationSet());
  set->ctx_ = acquireContext(device);
  set->device_ = device;
  set->ctx_->makeCurrent();
  const uint64_t granularity = vmmGranularity(device);
  for (uint64_t s : sizes) {
    uint64_t rounded = (s + granularity - 1) / granularity * granularity;
    set->offsets_.push_back(set->total_);
    set->sizes_.push_back(rounded);
    set->total_ += rounded;
  }
  try {
    CUmemAllocationProp prop = exportableAllocation(device);
    for (uint64_t s : set->sizes_) {
      CUmemGenericAllocationHandle handle = 0;
      check(api().cuMemCreate(&handle, s, &prop, 0), "cuMemCreate");
      set->handles_.push_back(handle);
    }
    if (fault::hit(fault::Point::MapReserve)) injected("reserve");
    set->base_ = vmm::reserve(set->total_, granularity);
    for (size_t i = 0; i < set->sizes_.size(); i++) {
      if (fault::hit(fault::Point::MapMap)) injected("map");
      vmm::map(set->base_ + set->offsets_[i], set->sizes_[i], set->handles_[i]);
      set->mapped_ = i + 1;
    }
    if (fault::hit(fault::Point::MapAccess)) injected("access");
    vmm::setAccess(device, set->base_, set->total_, set->sizes_.size());
  } catch (...) {
    set->undo();
    throw;
  }
  return set;
}

void AllocationSet::undo() noexcept {
  if (!ctx_) return;  // the context could not be had: nothing was made
  ctx_->makeCurrent();
  if (mapped_ > 0 && !vmm::unmapRange(base_, offsets_[mapped_ - 1] + sizes_[mapped_ - 1], mapped_)) {
    for (size_t i = 0; i < mapped_; i++) vmm::unmap(base_ + offsets_[i], sizes_[i]);
  }
  mapped_ = 0;
  if (base_) vmm::addressFree(base_, total_);
  base_ = 0;
  for (uint64_t h : handles_) api().cuMemRelease(h);  // cuMemCreate is not a timed step: nor is its release
  handles_.clear();
}

AllocationSet::~AllocationSet() { undo(); }

std::shared_ptr<Mapping> AllocationSet::view(size_t i) {
  if (i >= sizes_.size()) throwInvalid("region index out of range");
  return Mapping::exportableView(shared_from_this(), ctx_, base_ + offsets_[i], sizes_[i], handles_[i]);
}

}  // namespace vsnap::cuda
