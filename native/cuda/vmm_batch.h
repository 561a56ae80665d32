// The VMM steps of mapping another process's exported memory, one driver call each and each
// timed (cuda/vmm_timing.h), for the per-region Mapping (cuda/vmm.h) and the batched region set
// (transfer/region_batch.h: one reservation and one cuMemSetAccess per device for a whole set).
//
// The driver's rules the batched form relies on (CUDA Driver API, "Virtual Memory Management"):
// - cuMemMap: ptr, size and offset must be multiples of the minimum allocation granularity,
//   offset is 0, and the range must lie inside a cuMemAddressReserve reservation: several
//   allocations may be mapped side by side in one reservation.
// - cuMemSetAccess: "the range must be a fully mapped address range containing all allocations
//   created by cuMemMap / cuMemCreate", i.e. one call may span several mappings. PyTorch's
//   expandable segments do exactly that, for imported handles too (c10/cuda/CUDACachingAllocator.cpp,
//   ExpandableSegment::setAccess over [begin, end) segments after mapping each one).
// - cuMemUnmap: "the range must be the entire contiguous address range that was mapped to";
//   it cannot unmap a sub-range of one mapping. Whether one call may unmap several whole
//   mappings is not documented (PyTorch unmaps one segment at a time), so the batched set tries
//   one call over the range and unmaps each region when the driver refuses (unmapRange).
// - cuMemAddressFree: the size and pointer must be the reservation's.
#pragma once

#include <cstdint>

namespace vsnap::cuda::vmm {

struct Imported {
  uint64_t handle = 0;  // CUmemGenericAllocationHandle, released by release()
  int device = -1;      // where the physical memory lives
};

// cuMemImportFromShareableHandle (the fd is not consumed) and the handle's device; nothing
// stays imported when it throws (E_CUDA).
Imported importFd(int fd);
uint64_t granularity(int device);
// The calling thread's context must be the device's for the steps below (Context::makeCurrent).
uint64_t reserve(uint64_t bytes, uint64_t alignment);
void map(uint64_t va, uint64_t bytes, uint64_t handle);
void setAccess(int device, uint64_t va, uint64_t bytes, uint64_t regions = 1);
// One cuMemUnmap over [va, +bytes) covering `regions` whole mappings; false when refused.
bool unmapRange(uint64_t va, uint64_t bytes, uint64_t regions) noexcept;
void unmap(uint64_t va, uint64_t bytes) noexcept;
void addressFree(uint64_t va, uint64_t bytes) noexcept;
void release(uint64_t handle) noexcept;

}  // namespace vsnap::cuda::vmm
