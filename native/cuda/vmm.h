// Virtual memory management: exportable device memory, FD import, and mappings that are
// undone when their owner goes away (no mapping outlives the operation that needed it).
#pragma once

#include <cstdint>
#include <memory>

namespace vsnap::cuda {

class Context;

// A physical allocation mapped into this process: reserve + map + set access on create,
// unmap + free + release on destruction.
class Mapping {
 public:
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint64_t address() const { return va_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  const std::shared_ptr<Context>& context() const { return ctx_; }
  // The set a view belongs to (a batch or an AllocationSet: one address reservation per device,
  // its allocations mapped side by side), or null for a mapping of its own. A copy may run across
  // the border of two views of one set on one device whose addresses meet (the copy queue joins
  // such copies); never across two reservations.
  const void* span() const { return owner_.get(); }

  // Device memory created here, exportable as a POSIX file descriptor. size is rounded up
  // to the device's granularity.
  static std::unique_ptr<Mapping> allocate(int device, uint64_t size);
  // Memory another process exported as a POSIX file descriptor (the fd is not consumed).
  // size must not exceed the exported allocation; the device is read from the handle.
  static std::unique_ptr<Mapping> import(int fd, uint64_t size);
  // A view of memory mapped by someone else (one allocation of a batched set, cuda/vmm_batch.h):
  // undoes nothing itself; `owner` is kept alive while the view lives.
  static std::shared_ptr<Mapping> view(std::shared_ptr<void> owner, std::shared_ptr<Context> ctx, uint64_t va, uint64_t size);
  // A view of one allocation of a set made here (cuda/vmm_alloc_set.h), exportable through its
  // handle, which `owner` holds.
  static std::shared_ptr<Mapping> exportableView(std::shared_ptr<void> owner, std::shared_ptr<Context> ctx, uint64_t va, uint64_t size, uint64_t handle);

  // A new file descriptor for the physical memory (only for allocate()d memory).
  int exportFd() const;
  // Synchronous helpers for small transfers and tests (pageable host memory).
  void copyFromHost(uint64_t offset, const void* src, uint64_t length) const;
  void copyToHost(uint64_t offset, void* dst, uint64_t length) const;
  void fill(uint64_t offset, uint64_t length, uint8_t value) const;

 private:
  Mapping(std::shared_ptr<Context> ctx, uint64_t handle, uint64_t size, bool exportable);
  Mapping(std::shared_ptr<void> owner, std::shared_ptr<Context> ctx, uint64_t va, uint64_t size);
  void checkRange(uint64_t offset, uint64_t length) const;
  std::shared_ptr<Context> ctx_;
  int device_ = -1;
  uint64_t handle_ = 0;  // CUmemGenericAllocationHandle
  uint64_t va_ = 0;
  uint64_t size_ = 0;
  bool exportable_ = false;
  bool mapped_ = false;
  std::shared_ptr<void> owner_;  // a view's: what really holds the mapping
};

// A reference to another process's exported memory, without a mapping: while it lives, the
// physical memory stays allocated even after its owner released its own handle (tier 0 keeps a
// sleeping engine's weights on the GPU this way).
class HeldHandle {
 public:
  explicit HeldHandle(int fd);
  ~HeldHandle();
  HeldHandle(const HeldHandle&) = delete;
  HeldHandle& operator=(const HeldHandle&) = delete;

 private:
  uint64_t handle_ = 0;
};

}  // namespace vsnap::cuda
