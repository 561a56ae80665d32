// The CUDA backend of multi-path hydrate (multipath.h). Direct path: host -> target on
// directStreams streams of the target (slot i on stream i % directStreams), an event per slot.
// Relay path: host -> ring slot on a stream of the neighbour (issued in the neighbour's context
// into the neighbour's memory, so it uses the neighbour's PCIe link), then a second stream on the
// target waits for that copy's event and pulls the slot over NVLink into the target. A slot's
// "forwarded" event on the target stream is what frees it (back-pressure).
//
// The neighbour's primary context is kept between jobs (releaseWarmNeighbours frees it): made
// per job, its creation (which also maps every portable pinned host allocation, the whole RAM
// tier, into it) and its destruction were inside every restore's time, a fixed cost of the
// order of the 16 GiB copy itself.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/peer.h"
#include "cuda/vmm.h"
#include "transfer/multipath.h"

namespace vsnap::transfer {
namespace {

std::mutex gWarmMutex;
// Never destroyed: at process exit the driver may already be torn down when static
// destructors run, and the process's contexts go with it anyway.
auto* gWarm = new std::map<int, std::shared_ptr<cuda::Context>>();

std::shared_ptr<cuda::Context> warmNeighbour(int ordinal) {
  std::lock_guard<std::mutex> lock(gWarmMutex);
  auto& ctx = (*gWarm)[ordinal];
  if (!ctx) ctx = cuda::acquireContext(ordinal);
  return ctx;
}

class CudaMultipathBackend final : public MultipathBackend {
 public:
  CudaMultipathBackend(std::vector<std::shared_ptr<cuda::Mapping>> targets, std::vector<const char*> sources,
                       const CudaMultipathOptions& o)
      : targets_(std::move(targets)), sources_(std::move(sources)), slotSize_(o.slotSize) {
    if (targets_.empty()) throwInvalid("a multi-path restore needs at least one target region");
    target_ = targets_[0]->context();
    for (auto& t : targets_) {
      if (t->device() != target_->ordinal()) {
        throwInvalid("every region of a multi-path restore must be on one GPU (found GPUs " + std::to_string(target_->ordinal()) +
                     " and " + std::to_string(t->device()) + "); restore several GPUs with the plain restore");
      }
    }
    for (uint32_t i = 0; i < std::max<uint32_t>(1, std::min(o.directStreams, o.directSlots)); i++) {
      direct_.push_back(std::make_unique<cuda::CopyStream>(target_));
    }
    for (uint32_t i = 0; i < std::max<uint32_t>(1, o.directSlots); i++) directDone_.push_back(std::make_unique<cuda::Marker>(target_));
    if (o.neighbour < 0 || o.relaySlots == 0) {
      note_ = "no neighbour GPU was given";
      return;
    }
    if (o.neighbour == target_->ordinal()) throwInvalid("the neighbour GPU must differ from the target GPU");
    try {
      auto neighbour = warmNeighbour(o.neighbour);
      cuda::enablePeerAccess(target_, neighbour);
      ring_ = std::shared_ptr<cuda::Mapping>(cuda::Mapping::allocate(o.neighbour, static_cast<uint64_t>(o.relaySlots) * slotSize_));
      cuda::grantAccess(*ring_, target_->ordinal());
      stage_ = std::make_unique<cuda::CopyStream>(neighbour);
      pull_ = std::make_unique<cuda::CopyStream>(target_);
      for (uint32_t i = 0; i < o.relaySlots; i++) {
        staged_.push_back(std::make_unique<cuda::Marker>(neighbour));
        forwarded_.push_back(std::make_unique<cuda::Marker>(target_));
      }
      ringBytes_ = ring_->size();
    } catch (const NativeError& e) {
      releaseRelay();
      if (o.requireRelay) throw;
      note_ = std::string("the neighbour path was not used: ") + e.what();
    }
  }
  ~CudaMultipathBackend() override {
    // Streams first (their destructors wait for their work), then the memory they touched.
    releaseRelay();
    directDone_.clear();
    direct_.clear();
  }

  uint32_t directSlots() const override { return static_cast<uint32_t>(directDone_.size()); }
  uint32_t relaySlots() const override { return ring_ ? static_cast<uint32_t>(forwarded_.size()) : 0; }
  uint64_t ringBytes() const override { return ringBytes_.load(); }
  std::string relayNote() const override { return note_; }

  void directCopy(uint32_t slot, const MultipathChunk& c) override {
    cuda::CopyStream& stream = *direct_[slot % direct_.size()];
    stream.hostToDevice(targets_.at(c.task)->address() + c.offset, sources_.at(c.task) + c.offset, c.length);
    directDone_.at(slot)->record(stream);
  }
  void directWait(uint32_t slot) override { directDone_.at(slot)->wait(); }

  void relayCopy(uint32_t slot, const MultipathChunk& c) override {
    if (c.length > slotSize_) throw NativeError("E_INTERNAL", "chunk larger than a ring slot");
    uint64_t ringSlot = ring_->address() + slot * slotSize_;
    try {
      stage_->hostToDevice(ringSlot, sources_.at(c.task) + c.offset, c.length);
      staged_.at(slot)->record(*stage_);
      pull_->waitFor(*staged_[slot]);
      pull_->deviceToDevice(targets_.at(c.task)->address() + c.offset, ringSlot, c.length);
      forwarded_.at(slot)->record(*pull_);
    } catch (...) {
      // Nothing issued for this chunk may still run once the scheduler gives it back.
      try { stage_->synchronize(); } catch (...) {}
      try { pull_->synchronize(); } catch (...) {}
      throw;
    }
  }
  void relayWait(uint32_t slot) override {
    forwarded_.at(slot)->wait();
    staged_.at(slot)->wait();
  }

  void releaseRelay() override {
    // Markers and streams wait for their work when destroyed; the ring goes last.
    forwarded_.clear();
    staged_.clear();
    pull_.reset();
    stage_.reset();
    ring_.reset();
    ringBytes_ = 0;
  }

 private:
  std::vector<std::shared_ptr<cuda::Mapping>> targets_;
  std::vector<const char*> sources_;
  uint64_t slotSize_;
  std::shared_ptr<cuda::Context> target_;
  std::vector<std::unique_ptr<cuda::CopyStream>> direct_;
  std::vector<std::unique_ptr<cuda::Marker>> directDone_;
  std::shared_ptr<cuda::Mapping> ring_;
  std::unique_ptr<cuda::CopyStream> stage_;
  std::unique_ptr<cuda::CopyStream> pull_;
  std::vector<std::unique_ptr<cuda::Marker>> staged_;
  std::vector<std::unique_ptr<cuda::Marker>> forwarded_;
  std::atomic<uint64_t> ringBytes_{0};
  std::string note_;
};

}  // namespace

void releaseWarmNeighbours() {
  std::map<int, std::shared_ptr<cuda::Context>> gone;
  {
    std::lock_guard<std::mutex> lock(gWarmMutex);
    gone.swap(*gWarm);
  }
}  // a context still used by a running job lives on until that job ends

std::shared_ptr<MultipathBackend> cudaMultipathBackend(std::vector<std::shared_ptr<cuda::Mapping>> targets,
                                                       std::vector<const char*> sources, const CudaMultipathOptions& options) {
  return std::make_shared<CudaMultipathBackend>(std::move(targets), std::move(sources), options);
}

}  // namespace vsnap::transfer
