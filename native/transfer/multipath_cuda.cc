// The CUDA backend of multi-path hydrate (multipath.h): one stream on the target for the direct
// path; for the relay path, a stream on the neighbour for host -> ring slot, and a second stream
// on the target that waits for that copy's event and pulls the slot over NVLink into the target.
// A slot's "forwarded" event on the target stream is what frees it (back-pressure).
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/peer.h"
#include "cuda/vmm.h"
#include "transfer/multipath.h"

namespace vsnap::transfer {
namespace {

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
    direct_ = std::make_unique<cuda::CopyStream>(target_);
    for (uint32_t i = 0; i < std::max<uint32_t>(1, o.directSlots); i++) directDone_.push_back(std::make_unique<cuda::Marker>(target_));
    if (o.neighbour < 0 || o.relaySlots == 0) {
      note_ = "no neighbour GPU was given";
      return;
    }
    if (o.neighbour == target_->ordinal()) throwInvalid("the neighbour GPU must differ from the target GPU");
    try {
      auto neighbour = cuda::acquireContext(o.neighbour);
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
    direct_.reset();
  }

  uint32_t directSlots() const override { return static_cast<uint32_t>(directDone_.size()); }
  uint32_t relaySlots() const override { return ring_ ? static_cast<uint32_t>(forwarded_.size()) : 0; }
  uint64_t ringBytes() const override { return ringBytes_.load(); }
  std::string relayNote() const override { return note_; }

  void directCopy(uint32_t slot, const MultipathChunk& c) override {
    direct_->hostToDevice(targets_.at(c.task)->address() + c.offset, sources_.at(c.task) + c.offset, c.length);
    directDone_.at(slot)->record(*direct_);
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
  std::unique_ptr<cuda::CopyStream> direct_;
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

std::shared_ptr<MultipathBackend> cudaMultipathBackend(std::vector<std::shared_ptr<cuda::Mapping>> targets,
                                                       std::vector<const char*> sources, const CudaMultipathOptions& options) {
  return std::make_shared<CudaMultipathBackend>(std::move(targets), std::move(sources), options);
}

}  // namespace vsnap::transfer
