#include "transfer/region_set.h"

#include "common/error.h"
#include "cuda/vmm_timing.h"
#include "transfer/region_batch.h"
#include "transfer/region_pipeline.h"

#include <algorithm>

namespace vsnap::transfer {
namespace {

std::atomic<uint64_t> hostMaps{0};
std::atomic<uint64_t> imports{0};

class SharedRegion final : public Region {
 public:
  explicit SharedRegion(std::shared_ptr<Region> inner) : inner_(std::move(inner)) {}
  uint64_t size() const override { return inner_->size(); }
  int device() const override { return inner_->device(); }
  char* hostMemory() const override { return inner_->hostMemory(); }
  const char* mappedHost() const override { return inner_->mappedHost(); }
  std::shared_ptr<cuda::Mapping> deviceMapping() const override { return inner_->deviceMapping(); }
  const void* span() const override { return inner_->span(); }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    inner_->copyOut(offset, dst, length, lane, slot, fence);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    inner_->copyIn(offset, src, length, lane, slot, fence);
  }

 private:
  std::shared_ptr<Region> inner_;
};

// One region at a time: each host region mmapped, each device allocation reserved, mapped and
// made accessible on its own (cuda::Mapping).
std::vector<std::shared_ptr<Region>> openPerRegion(const std::vector<RegionSpec>& specs, uint32_t threads) {
  std::vector<std::shared_ptr<Region>> regions(specs.size());
  forEachRegion(specs.size(), threads, [&](size_t i) {
    const RegionSpec& s = specs[i];
    regions[i] = s.imported ? std::shared_ptr<Region>(importedRegion(s.fd.get(), s.size)) : std::shared_ptr<Region>(hostRegion(s.fd.get(), s.size));
  }, [](size_t i) { return i; });
  return regions;  // on failure, the regions opened so far are closed as `regions` goes
}

}  // namespace

void closeSpecs(std::vector<RegionSpec>& specs, size_t begin, size_t end) {
  for (size_t i = begin; i < end; i++) {
    if (!specs[i].fd.valid()) continue;
    cuda::VmmTimer timer(cuda::VmmStep::CloseFd);
    specs[i].fd.reset();
  }
}

std::vector<std::shared_ptr<Region>> openSpecsBatched(const std::vector<RegionSpec>& specs, size_t begin, size_t end, uint32_t threads) {
  std::vector<std::shared_ptr<Region>> regions(end - begin);
  for (bool imported : {false, true}) {  // host regions as one batch, imported ones as another
    std::vector<BatchInput> inputs;
    for (size_t i = begin; i < end; i++) {
      if (specs[i].imported == imported) inputs.push_back({specs[i].fd.get(), specs[i].size, i});
    }
    if (inputs.empty()) continue;
    auto opened = openBatched(inputs, imported, threads);
    for (size_t k = 0; k < inputs.size(); k++) regions[inputs[k].label - begin] = std::move(opened[k]);
  }
  return regions;
}

std::shared_ptr<RegionSet> RegionSet::open(std::vector<RegionSpec> specs, uint32_t threads, MapMode mode) {
  struct CloseFds {
    std::vector<RegionSpec>& specs;
    ~CloseFds() { closeSpecs(specs, 0, specs.size()); }
  } closeFds{specs};
  std::shared_ptr<RegionSet> set(new RegionSet());
  bool devicesKnown = std::all_of(specs.begin(), specs.end(), [](const RegionSpec& s) { return !s.imported || s.device >= 0; });
  if (mode == MapMode::Pipelined && devicesKnown && !specs.empty()) {
    set->pipeline_ = RegionPipeline::start(std::move(specs), threads);  // takes the descriptors
    set->regions_ = set->pipeline_->regions();
    set->batched_ = true;
    return set;
  }
  if (mode == MapMode::PerRegion) {
    set->regions_ = openPerRegion(specs, threads);
    return set;
  }
  try {
    set->regions_ = openSpecsBatched(specs, 0, specs.size(), threads);
    set->batched_ = true;
  } catch (const NativeError& e) {
    // Nothing of the batch is left at this point. An invalid argument fails either way.
    if (mode != MapMode::Auto || e.code() == "E_INVALID_ARGUMENT") throw;
    set->regions_ = openPerRegion(specs, threads);
  }
  return set;
}

RegionSet::~RegionSet() = default;

void RegionSet::settle() const {
  if (pipeline_) pipeline_->settle();
}

std::shared_ptr<Region> RegionSet::at(size_t i) const {
  if (i >= regions_.size()) {
    throw NativeError("E_OUT_OF_RANGE", "region " + std::to_string(i) + " of a set of " + std::to_string(regions_.size()));
  }
  return regions_[i];
}

std::unique_ptr<Region> sharedRegion(std::shared_ptr<Region> region) { return std::make_unique<SharedRegion>(std::move(region)); }

RegionCounters regionCounters() { return {hostMaps.load(), imports.load()}; }
void countHostMap() { hostMaps++; }
void countImport() { imports++; }

}  // namespace vsnap::transfer
