#include "transfer/region.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>
#include <cstring>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/stream.h"
#include "cuda/vmm.h"
#include "io/files.h"
#include "transfer/region_set.h"

namespace vsnap::transfer {

struct Lane::PerDevice {
  std::shared_ptr<cuda::Context> ctx;
  std::unique_ptr<cuda::Stream> stream;
  std::unique_ptr<cuda::Event> events[2];
};

Lane::Lane() = default;
Lane::~Lane() = default;

void Lane::synchronize() {
  for (auto& [device, d] : devices_) {
    if (d->stream) d->stream->synchronize();
  }
}

void Lane::synchronize(const std::function<void(int)>& drained) {
  std::vector<std::pair<int, cuda::Event*>> pending;
  for (auto& [device, d] : devices_) {
    if (!d->stream) continue;
    if (!d->events[0]) d->events[0] = std::make_unique<cuda::Event>(d->ctx);
    d->events[0]->record(*d->stream);
    pending.emplace_back(device, d->events[0].get());
  }
  while (!pending.empty()) {
    for (size_t i = 0; i < pending.size();) {
      if (pending[i].second->done()) {
        drained(pending[i].first);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        i++;
      }
    }
    if (!pending.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

cuda::Stream& Lane::stream(const std::shared_ptr<cuda::Context>& ctx) {
  auto& d = devices_[ctx->ordinal()];
  if (!d) d = std::make_unique<PerDevice>();
  if (!d->stream) d->stream = std::make_unique<cuda::Stream>(ctx);
  d->ctx = ctx;
  return *d->stream;
}

cuda::Event& Lane::event(const std::shared_ptr<cuda::Context>& ctx, int slot) {
  auto& d = devices_[ctx->ordinal()];
  if (!d) d = std::make_unique<PerDevice>();
  if (!d->events[slot]) d->events[slot] = std::make_unique<cuda::Event>(ctx);
  return *d->events[slot];
}

void Fence::wait() {
  if (event) event->wait();
  event = nullptr;
}

namespace {

void checkRange(const Region& r, uint64_t offset, uint64_t length) {
  if (offset > r.size() || length > r.size() - offset) {
    throw NativeError("E_OUT_OF_RANGE", "copy of [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                            ") is outside a region of " + std::to_string(r.size()) + " bytes");
  }
}

class HostRegion final : public Region {
 public:
  HostRegion(int fd, uint64_t size) : size_(size) {
    uint64_t actual = io::fdSize(fd);
    if (actual < size) {
      throwInvalid("host region descriptor holds " + std::to_string(actual) + " bytes, less than the " +
                   std::to_string(size) + " the region declares");
    }
    if (size == 0) return;
    // MAP_POPULATE maps every page in one pass instead of one fault per 4 KiB page per job.
    base_ = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      throwSystemError("mmap", "host region fd " + std::to_string(fd), errno);
    }
    countHostMap();
  }
  ~HostRegion() override {
    if (base_) munmap(base_, size_);
  }
  uint64_t size() const override { return size_; }
  int device() const override { return -1; }
  const char* mappedHost() const override { return static_cast<const char*>(base_); }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane&, int, Fence&) override {
    checkRange(*this, offset, length);
    std::memcpy(dst, static_cast<const char*>(base_) + offset, length);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane&, int, Fence&) override {
    checkRange(*this, offset, length);
    std::memcpy(static_cast<char*>(base_) + offset, src, length);
  }

 private:
  uint64_t size_;
  void* base_ = nullptr;
};

class DeviceRegion final : public Region {
 public:
  DeviceRegion(std::shared_ptr<cuda::Mapping> mapping, uint64_t size) : mapping_(std::move(mapping)), size_(size) {
    if (size > mapping_->size()) {
      throwInvalid("region of " + std::to_string(size) + " bytes does not fit its " +
                   std::to_string(mapping_->size()) + "-byte device mapping");
    }
  }
  uint64_t size() const override { return size_; }
  int device() const override { return mapping_->device(); }
  std::shared_ptr<cuda::Mapping> deviceMapping() const override { return mapping_; }
  const void* span() const override { return mapping_->span(); }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    checkRange(*this, offset, length);
    auto& stream = lane.stream(mapping_->context());
    stream.copyToHost(dst, mapping_->address() + offset, length);
    fence.event = &lane.event(mapping_->context(), slot);
    fence.event->record(stream);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane& lane, int slot, Fence& fence) override {
    checkRange(*this, offset, length);
    auto& stream = lane.stream(mapping_->context());
    stream.copyToDevice(mapping_->address() + offset, src, length);
    fence.event = &lane.event(mapping_->context(), slot);
    fence.event->record(stream);
  }

 private:
  std::shared_ptr<cuda::Mapping> mapping_;
  uint64_t size_;
};

}  // namespace

std::unique_ptr<Region> hostRegion(int fd, uint64_t size) { return std::make_unique<HostRegion>(fd, size); }

std::unique_ptr<Region> deviceRegion(std::shared_ptr<cuda::Mapping> mapping, uint64_t size) {
  return std::make_unique<DeviceRegion>(std::move(mapping), size);
}

std::unique_ptr<Region> importedRegion(int fd, uint64_t size) {
  countImport();
  return std::make_unique<DeviceRegion>(std::shared_ptr<cuda::Mapping>(cuda::Mapping::import(fd, size)), size);
}

}  // namespace vsnap::transfer
