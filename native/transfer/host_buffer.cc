#include "transfer/host_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/stream.h"

namespace vsnap::transfer {

void keepFromChildren(void* base, uint64_t size) {
  // Best effort: an anonymous private mapping always takes it; without it the buffer still works.
  if (madvise(base, size, MADV_DONTFORK) != 0) return;
}

// Faults every page in now, so neither pinning nor the first copy pays for it later:
// MADV_POPULATE_WRITE (Linux 5.14), else (a kernel without it) one write a page. Best effort, as
// MAP_POPULATE was: memory that cannot be had now fails the pinning, with its own error.
static void populate(void* base, uint64_t size) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  if (madvise(base, size, MADV_POPULATE_WRITE) == 0 || errno != EINVAL) return;
  volatile char* bytes = static_cast<volatile char*>(base);
  for (uint64_t off = 0; off < size; off += 4096) bytes[off] = 0;
}

HostBuffer::HostBuffer(uint64_t size, int pinDevice) : size_(size) {
  if (size == 0) throwInvalid("a host buffer needs a size > 0");
  base_ = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throwSystemError("mmap", "host buffer of " + std::to_string(size) + " bytes", errno);
  }
  // Advised before its pages exist, so a kernel whose transparent huge pages are "madvise" (the
  // usual default) backs it with 2 MiB pages: advised after MAP_POPULATE, it kept 4 KiB ones.
  madvise(base_, size, MADV_HUGEPAGE);
  keepFromChildren(base_, size);
  populate(base_, size);
  try {
    if (pinDevice >= 0) registration_ = std::make_unique<cuda::HostRegistration>(cuda::acquireContext(pinDevice), base_, size);
  } catch (...) {
    munmap(base_, size);
    throw;
  }
}

HostBuffer::~HostBuffer() {
  registration_.reset();
  if (base_) munmap(base_, size_);
}

namespace {

class BufferRegion final : public Region {
 public:
  BufferRegion(std::shared_ptr<HostBuffer> buffer, uint64_t offset, uint64_t size)
      : buffer_(std::move(buffer)), offset_(offset), size_(size) {
    if (offset > buffer_->size() || size > buffer_->size() - offset) {
      throw NativeError("E_OUT_OF_RANGE", "region [" + std::to_string(offset) + ", +" + std::to_string(size) +
                                              ") is outside a " + std::to_string(buffer_->size()) + "-byte host buffer");
    }
  }
  uint64_t size() const override { return size_; }
  int device() const override { return -1; }
  char* hostMemory() const override { return buffer_->data() + offset_; }
  void copyOut(uint64_t offset, void* dst, uint64_t length, Lane&, int, Fence&) override {
    check(offset, length);
    std::memcpy(dst, buffer_->data() + offset_ + offset, length);
  }
  void copyIn(uint64_t offset, const void* src, uint64_t length, Lane&, int, Fence&) override {
    check(offset, length);
    std::memcpy(buffer_->data() + offset_ + offset, src, length);
  }

 private:
  void check(uint64_t offset, uint64_t length) const {
    if (offset > size_ || length > size_ - offset) throw NativeError("E_OUT_OF_RANGE", "copy outside a host buffer region");
  }
  std::shared_ptr<HostBuffer> buffer_;
  uint64_t offset_;
  uint64_t size_;
};

}  // namespace

std::unique_ptr<Region> bufferRegion(std::shared_ptr<HostBuffer> buffer, uint64_t offset, uint64_t size) {
  return std::make_unique<BufferRegion>(std::move(buffer), offset, size);
}

}  // namespace vsnap::transfer
