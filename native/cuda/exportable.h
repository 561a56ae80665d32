// For native/cuda only: the allocation properties of memory exportable as a POSIX descriptor.
#pragma once

#include <cuda.h>

namespace vsnap::cuda {

inline CUmemAllocationProp exportableAllocation(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace vsnap::cuda
