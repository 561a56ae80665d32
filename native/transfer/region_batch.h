// The batched form of opening a region set (issue 14, per-region cost): instead of one address
// reservation, one mapping and one access call per region (cuda::Mapping), every allocation of
// a device is imported, ONE reservation is made for all of them, each is mapped at its offset
// inside it, and ONE cuMemSetAccess covers each contiguous run; on close one cuMemUnmap covers
// the range where the driver accepts it (else one per region) and one cuMemAddressFree frees it.
// The rules this relies on are cited in cuda/vmm_batch.h. Host memory (memfd) has the same
// shape on the CPU (one PROT_NONE reservation, MAP_FIXED mappings, one mprotect), so the CPU
// test suite runs the same steps and failure paths: a fault injected at any step
// (common/fault.h: map-import, map-reserve, map-map, map-access) undoes everything done so far.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "transfer/region.h"

namespace vsnap::transfer {

struct BatchInput {
  int fd = -1;        // not consumed; only used while opening
  uint64_t size = 0;
  size_t label = 0;   // the region's index in its set, for error messages
};

// Opens every input as one batch (all host memory, or all imported device memory). The returned
// regions share the batch: it is undone when the last of them goes. On failure nothing stays
// imported, reserved or mapped, and the first error is thrown ("region <label>: ...").
std::vector<std::shared_ptr<Region>> openBatched(const std::vector<BatchInput>& inputs, bool imported, uint32_t threads);

struct RegionSpec;
// Opens specs[begin, end) batched (host regions as one batch, imported ones as another); the
// labels in errors are the specs' indices. Defined in region_set.cc.
std::vector<std::shared_ptr<Region>> openSpecsBatched(const std::vector<RegionSpec>& specs, size_t begin, size_t end, uint32_t threads);

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller's included); stops at the
// first failure and rethrows it as "region <label(i)>: ..." once every thread is done.
void forEachRegion(size_t n, uint32_t threads, const std::function<void(size_t)>& fn, const std::function<size_t(size_t)>& label);

}  // namespace vsnap::transfer
