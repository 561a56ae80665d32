#include "transfer/region_pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "common/error.h"
#include "cuda/vmm_timing.h"
#include "transfer/region_batch.h"
#include "transfer/region_set.h"

namespace vsnap::transfer {
namespace {

// The first chunk is small so the copy starts early; later ones grow to amortise the
// reservation and the access call, up to 64 regions. Larger chunks let the copy catch up with the
// mapping: opening a region costs about as long as copying 4 MiB into it (H100, 2026-12-06), so
// a chunk twice the size of the one being copied is not mapped by the time that copy ends, and
// the copy waits at every chunk. Measured at 4,000 regions of 4 MiB (bench/import-pipeline.cu,
// bench/results/README.md): chunks up to 512 took 1.104x the copy into premapped memory, up to
// 128 1.066x, every chunk 64 1.021x.
constexpr size_t kFirstChunk = 16;
constexpr size_t kLargestChunk = 64;

// One region's outcome, filled in by the opener.
struct Slot {
  std::mutex mutex;
  std::condition_variable ready;
  std::shared_ptr<Region> inner;
  std::optional<NativeError> error;

  void fulfil(std::shared_ptr<Region> r) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      inner = std::move(r);
    }
    ready.notify_all();
  }
  void fail(const NativeError& e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!inner && !error) error = e;
    }
    ready.notify_all();
  }
  Region& get() {
    std::unique_lock<std::mutex> lock(mutex);
    // wait_for, not wait: condition_variable::wait needs GLIBCXX_3.4.30, past the prebuild's floor.
    while (!inner && !error) ready.wait_for(lock, std::chrono::milliseconds(100));
    if (error) throw *error;
    return *inner;
  }
};

// Stands in for a region until its chunk is mapped. Size and device are known up front (the
// transfer plans with them); everything that touches the memory waits for the mapping.
class PendingRegion final : public Region {
 public:
  PendingRegion(std::shared_ptr<Slot> slot, uint64_t size, int device) : slot_(std::move(slot)), size_(size), device_(device) {}
  uint64_t size() const override { return size_; }
  int device() const override { return device_; }
  const char* mappedHost() const override { return slot_->get().mappedHost(); }
  std::shared_ptr<cuda::Mapping> deviceMapping() const override { return slot_->get().deviceMapping(); }
  const void* span() const override { return slot_->get().span(); }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    slot_->get().copyOut(offset, dst, length, lane, slot, fence);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    slot_->get().copyIn(offset, src, length, lane, slot, fence);
  }

 private:
  std::shared_ptr<Slot> slot_;
  uint64_t size_;
  int device_;
};

}  // namespace

struct RegionPipeline::State {
  std::vector<RegionSpec> specs;
  std::vector<std::shared_ptr<Slot>> slots;
  uint32_t threads = 0;
  std::atomic<bool> cancel{false};
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::optional<NativeError> error;
  std::thread opener;

  void run() {
    size_t n = specs.size(), next = 0, chunk = kFirstChunk;
    std::optional<NativeError> failure;
    while (next < n && !failure) {
      if (cancel.load()) {
        failure = NativeError("E_CLOSED", "the region set was closed before region " + std::to_string(next) + " was mapped");
        break;
      }
      size_t end = std::min(n, next + chunk);
      try {
        auto opened = openSpecsBatched(specs, next, end, threads);
        for (size_t i = next; i < end; i++) slots[i]->fulfil(std::move(opened[i - next]));
      } catch (const NativeError& e) {
        failure = e;
      } catch (const std::exception& e) {
        failure = NativeError("E_INTERNAL", e.what());
      }
      closeSpecs(specs, next, end);
      if (failure) break;
      next = end;
      chunk = std::min(chunk * 2, kLargestChunk);
    }
    if (failure) {
      for (size_t i = next; i < n; i++) slots[i]->fail(*failure);
    }
    for (RegionSpec& s : specs) s.fd.reset();  // those after a failure
    {
      std::lock_guard<std::mutex> lock(mutex);
      error = failure;
      done = true;
    }
    finished.notify_all();
  }
};

std::shared_ptr<RegionPipeline> RegionPipeline::start(std::vector<RegionSpec> specs, uint32_t threads) {
  std::shared_ptr<RegionPipeline> p(new RegionPipeline());
  p->state_ = std::make_shared<State>();
  State& st = *p->state_;
  st.threads = threads;
  for (const RegionSpec& s : specs) {
    auto slot = std::make_shared<Slot>();
    st.slots.push_back(slot);
    p->regions_.push_back(std::make_shared<PendingRegion>(slot, s.size, s.imported ? s.device : -1));
  }
  st.specs = std::move(specs);
  std::shared_ptr<State> state = p->state_;
  try {
    st.opener = std::thread([state] { state->run(); });
  } catch (const std::system_error&) {
    state->run();  // no thread to be had: open them here, as the batched form would
  }
  return p;
}

RegionPipeline::~RegionPipeline() {
  state_->cancel = true;
  if (state_->opener.joinable()) state_->opener.join();
}

void RegionPipeline::settle() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  while (!state_->done) state_->finished.wait_for(lock, std::chrono::milliseconds(100));
  if (state_->error) throw *state_->error;
}

}  // namespace vsnap::transfer
