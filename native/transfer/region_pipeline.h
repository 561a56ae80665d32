// The pipelined form of opening a region set (issue 14, per-region cost): the set is returned at
// once with a stand-in for every region, and a background thread opens the regions in order, in
// growing chunks (16, 32, then 64 regions at a time, each chunk batched: transfer/region_batch.h). A copy
// into region i waits only until region i's chunk is mapped, so the hydrate's DMA starts on the
// first regions while the rest are still imported and mapped. A region whose chunk failed throws
// that chunk's error at its first use; settle() waits for the whole set and throws it too.
// Everything opened is undone when the set and the last transfer using its regions are gone.
#pragma once

#include <memory>
#include <vector>

#include "transfer/region.h"

namespace vsnap::transfer {

struct RegionSpec;

class RegionPipeline {
 public:
  // Takes the specs (their descriptors are closed as each chunk is opened). Every imported spec
  // must name its device (the stand-ins answer device() before the import).
  static std::shared_ptr<RegionPipeline> start(std::vector<RegionSpec> specs, uint32_t threads);
  // Stops after the chunk being opened; regions not opened then fail with E_CLOSED.
  ~RegionPipeline();
  RegionPipeline(const RegionPipeline&) = delete;
  RegionPipeline& operator=(const RegionPipeline&) = delete;

  const std::vector<std::shared_ptr<Region>>& regions() const { return regions_; }
  // Waits until every region is opened or the opening failed; throws the first error.
  void settle();

 private:
  struct State;
  RegionPipeline() = default;
  std::shared_ptr<State> state_;
  std::vector<std::shared_ptr<Region>> regions_;
};

}  // namespace vsnap::transfer
