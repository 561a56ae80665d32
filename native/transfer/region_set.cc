#include "transfer/region_set.h"

#include <algorithm>
#include <optional>
#include <system_error>
#include <thread>

#include "common/error.h"

namespace vsnap::transfer {
namespace {

std::atomic<uint64_t> hostMaps{0};
std::atomic<uint64_t> imports{0};

// Driver calls serialise on a per-context lock, but mmap with MAP_POPULATE and the page-table
// work of cuMemMap do not: a few threads are enough to hide one region's latency behind another's.
constexpr uint32_t kDefaultThreads = 4;
// Below this many regions per thread, starting threads costs more than it saves.
constexpr size_t kRegionsPerThread = 8;

class SharedRegion final : public Region {
 public:
  explicit SharedRegion(std::shared_ptr<Region> inner) : inner_(std::move(inner)) {}
  uint64_t size() const override { return inner_->size(); }
  int device() const override { return inner_->device(); }
  char* hostMemory() const override { return inner_->hostMemory(); }
  const char* mappedHost() const override { return inner_->mappedHost(); }
  std::shared_ptr<cuda::Mapping> deviceMapping() const override { return inner_->deviceMapping(); }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    inner_->copyOut(offset, dst, length, lane, slot, fence);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    inner_->copyIn(offset, src, length, lane, slot, fence);
  }

 private:
  std::shared_ptr<Region> inner_;
};

}  // namespace

std::shared_ptr<RegionSet> RegionSet::open(std::vector<RegionSpec> specs, uint32_t threads) {
  std::shared_ptr<RegionSet> set(new RegionSet());
  set->regions_.resize(specs.size());
  size_t n = specs.size();
  uint32_t wanted = threads ? threads : kDefaultThreads;
  uint32_t workers = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>(wanted, (n + kRegionsPerThread - 1) / kRegionsPerThread)));
  std::atomic<size_t> cursor{0};
  std::atomic<bool> failed{false};
  std::mutex errorMutex;
  std::optional<NativeError> error;
  auto work = [&] {
    while (!failed.load()) {
      size_t i = cursor.fetch_add(1);
      if (i >= n) return;
      std::optional<NativeError> e;
      try {
        const RegionSpec& s = specs[i];
        set->regions_[i] = s.imported ? std::shared_ptr<Region>(importedRegion(s.fd.get(), s.size))
                                      : std::shared_ptr<Region>(hostRegion(s.fd.get(), s.size));
      } catch (const NativeError& x) {
        e = x;
      } catch (const std::exception& x) {
        e = NativeError("E_INTERNAL", x.what());
      }
      if (e) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!error) error = NativeError(e->code(), "region " + std::to_string(i) + ": " + e->what(), e->details());
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t w = 1; w < workers; w++) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // the calling thread still does the work
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) throw *error;  // `set` goes out of scope: every region opened is closed again
  return set;
}

RegionSet::~RegionSet() = default;

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
