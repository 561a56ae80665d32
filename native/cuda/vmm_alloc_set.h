// Device memory for several regions made in one go: one exportable physical allocation per
// region (each exported on its own, for a peer to map in its place), all mapped side by side in
// one address reservation here, with one cuMemSetAccess over the whole range (the driver's rules
// for that: cuda/vmm_batch.h). Per region it saves a reservation and an access call, the larger
// part of making memory one region at a time (bench/results: 252 regions, 13.0 + 19.8 ms of 67).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace vsnap::cuda {

class Context;
class Mapping;

class AllocationSet : public std::enable_shared_from_this<AllocationSet> {
 public:
  // Every size is rounded up to the device's granularity. Nothing stays allocated or mapped
  // when it throws.
  static std::shared_ptr<AllocationSet> allocate(int device, const std::vector<uint64_t>& sizes);
  ~AllocationSet();
  AllocationSet(const AllocationSet&) = delete;
  AllocationSet& operator=(const AllocationSet&) = delete;

  size_t count() const { return sizes_.size(); }
  // Region i as a Mapping (exportable; the set stays alive while a view does).
  std::shared_ptr<Mapping> view(size_t i);

 private:
  AllocationSet() = default;
  void undo() noexcept;
  std::shared_ptr<Context> ctx_;
  int device_ = -1;
  uint64_t base_ = 0;   // the reservation
  uint64_t total_ = 0;  // its size
  std::vector<uint64_t> sizes_, offsets_, handles_;
  size_t mapped_ = 0;  // regions mapped so far (in order)
};

}  // namespace vsnap::cuda
