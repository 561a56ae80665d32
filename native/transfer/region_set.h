// RegionSet: many regions opened (host memory mmapped, exported device memory imported and
// mapped) in one call, on a few threads, and then shared by every operation of one engine flow
// (the hydrate and the GPU digest after it; the dirty check and the capture), so nothing is
// imported or mapped twice. Regions stay open until the set is closed and the last transfer
// that uses one ends (they are held by shared_ptr).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/fd.h"
#include "transfer/region.h"

namespace vsnap::transfer {

struct RegionSpec {
  bool imported = false;  // device memory exported by another process; else host memory (memfd)
  UniqueFd fd;            // our own duplicate: the set does not consume the caller's descriptor
  uint64_t size = 0;
  int device = -1;        // an imported region's device when the caller knows it (-1: unknown)
};

// Closes the descriptors of specs [begin, end) that are still open, each timed as a CloseFd step.
void closeSpecs(std::vector<RegionSpec>& specs, size_t begin, size_t end);

// How a set maps its regions: batched (transfer/region_batch.h: one reservation and one access
// call per device), one region at a time (cuda::Mapping each), or batched falling back to one at
// a time when the batched form fails for any reason other than an invalid argument.
// Pipelined: returned at once, regions opened in the background in batched chunks
// (transfer/region_pipeline.h); needs every imported region's device, else it is batched.
enum class MapMode { Auto, Batched, PerRegion, Pipelined };

class RegionPipeline;

class RegionSet {
 public:
  // Opens every region with up to `threads` threads (0: a default). On any failure every region
  // already opened is closed again and the first error is thrown. The descriptors are closed
  // before it returns.
  static std::shared_ptr<RegionSet> open(std::vector<RegionSpec> specs, uint32_t threads, MapMode mode = MapMode::Auto);
  ~RegionSet();

  size_t count() const { return regions_.size(); }
  // Whether the regions were mapped in the batched form (false: one at a time).
  bool batched() const { return batched_; }
  bool pipelined() const { return pipeline_ != nullptr; }
  // Waits until every region is opened (a pipelined set; others are at once); throws its error.
  void settle() const;
  // The i-th region (throws E_OUT_OF_RANGE), shared: it stays open while the returned pointer lives.
  std::shared_ptr<Region> at(size_t i) const;

 private:
  RegionSet() = default;
  std::vector<std::shared_ptr<Region>> regions_;
  bool batched_ = false;
  std::shared_ptr<RegionPipeline> pipeline_;  // declared last: stopped before the regions go
};

// A Region that forwards to a shared one (a RegionSet's), for a transfer task that owns its region.
std::unique_ptr<Region> sharedRegion(std::shared_ptr<Region> region);

// How many times this process mapped region memory (mmap of a host region, import + map of an
// exported device allocation), for tests that prove a flow maps nothing twice.
struct RegionCounters {
  uint64_t hostMaps;
  uint64_t imports;
};
RegionCounters regionCounters();
void countHostMap();
void countImport();

}  // namespace vsnap::transfer
