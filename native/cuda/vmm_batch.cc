#include "cuda/vmm_batch.h"

#include "common/error.h"
#include "cuda/devices.h"
#include "cuda/driver.h"
#include "cuda/vmm_timing.h"

namespace vsnap::cuda::vmm {

Imported importFd(int fd) {
  const Api& cu = api();
  CUmemGenericAllocationHandle handle = 0;
  {
    VmmTimer timer(VmmStep::Import);
    check(cu.cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
  }
  CUmemAllocationProp prop{};
  CUresult r;
  {
    VmmTimer timer(VmmStep::Props);
    r = cu.cuMemGetAllocationPropertiesFromHandle(&prop, handle);
    if (r != CUDA_SUCCESS) timer.fail();
  }
  if (r != CUDA_SUCCESS || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    release(handle);
    check(r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r, "cuMemGetAllocationPropertiesFromHandle");
  }
  return {handle, prop.location.id};
}

uint64_t granularity(int device) { return vmmGranularity(device); }

uint64_t reserve(uint64_t bytes, uint64_t alignment) {
  CUdeviceptr va = 0;
  VmmTimer timer(VmmStep::Reserve);
  check(api().cuMemAddressReserve(&va, bytes, alignment, 0, 0), "cuMemAddressReserve");
  return va;
}

void map(uint64_t va, uint64_t bytes, uint64_t handle) {
  VmmTimer timer(VmmStep::Map);
  check(api().cuMemMap(va, bytes, 0, handle, 0), "cuMemMap");
}

void setAccess(int device, uint64_t va, uint64_t bytes, uint64_t regions) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  VmmTimer timer(VmmStep::Access, regions);
  check(api().cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess");
}

bool unmapRange(uint64_t va, uint64_t bytes, uint64_t regions) noexcept {
  VmmTimer timer(VmmStep::Unmap, regions);
  bool ok = api().cuMemUnmap(va, bytes) == CUDA_SUCCESS;
  if (!ok) timer.fail();  // a refused call covered nothing: each region is then unmapped on its own
  return ok;
}

void unmap(uint64_t va, uint64_t bytes) noexcept {
  VmmTimer timer(VmmStep::Unmap);
  api().cuMemUnmap(va, bytes);
}

void addressFree(uint64_t va, uint64_t bytes) noexcept {
  VmmTimer timer(VmmStep::AddressFree);
  api().cuMemAddressFree(va, bytes);
}

void release(uint64_t handle) noexcept {
  VmmTimer timer(VmmStep::Release);
  api().cuMemRelease(handle);
}

}  // namespace vsnap::cuda::vmm
