#include "cuda/vmm.h"

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/devices.h"
#include "cuda/driver.h"
#include "cuda/exportable.h"

namespace vsnap::cuda {
namespace {
uint64_t roundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Imports another process's exported (POSIX-FD) handle; the descriptor is not consumed.
CUmemGenericAllocationHandle importHandle(int fd) {
  CUmemGenericAllocationHandle handle = 0;
  check(api().cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle");
  return handle;
}
}  // namespace

Mapping::Mapping(std::shared_ptr<Context> ctx, uint64_t handle, uint64_t size, bool exportable)
    : ctx_(std::move(ctx)), device_(ctx_->ordinal()), handle_(handle), size_(size), exportable_(exportable) {
  const Api& cu = api();
  ctx_->makeCurrent();
  CUdeviceptr va = 0;
  CUresult r = cu.cuMemAddressReserve(&va, size_, vmmGranularity(device_), 0, 0);
  if (r != CUDA_SUCCESS) {
    cu.cuMemRelease(handle_);
    check(r, "cuMemAddressReserve");
  }
  va_ = va;
  r = cu.cuMemMap(va, size_, 0, handle_, 0);
  if (r == CUDA_SUCCESS) {
    mapped_ = true;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cu.cuMemSetAccess(va, size_, &access, 1);
  }
  if (r != CUDA_SUCCESS) {
    if (mapped_) cu.cuMemUnmap(va, size_);
    cu.cuMemAddressFree(va, size_);
    cu.cuMemRelease(handle_);
    check(r, mapped_ ? "cuMemSetAccess" : "cuMemMap");
  }
}

Mapping::~Mapping() {
  const Api& cu = api();
  ctx_->makeCurrent();
  if (mapped_) cu.cuMemUnmap(va_, size_);
  cu.cuMemAddressFree(va_, size_);
  cu.cuMemRelease(handle_);
}

std::unique_ptr<Mapping> Mapping::allocate(int device, uint64_t size) {
  if (size == 0) throwInvalid("device allocation size must be > 0");
  auto ctx = acquireContext(device);
  ctx->makeCurrent();
  uint64_t rounded = roundUp(size, vmmGranularity(device));
  CUmemAllocationProp prop = exportableAllocation(device);
  CUmemGenericAllocationHandle handle = 0;
  check(api().cuMemCreate(&handle, rounded, &prop, 0), "cuMemCreate");
  return std::unique_ptr<Mapping>(new Mapping(std::move(ctx), handle, rounded, true));
}

std::unique_ptr<Mapping> Mapping::import(int fd, uint64_t size) {
  if (size == 0) throwInvalid("imported region size must be > 0");
  const Api& cu = api();
  CUmemGenericAllocationHandle handle = importHandle(fd);
  CUmemAllocationProp prop{};
  CUresult r = cu.cuMemGetAllocationPropertiesFromHandle(&prop, handle);
  if (r != CUDA_SUCCESS || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    cu.cuMemRelease(handle);
    check(r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r, "cuMemGetAllocationPropertiesFromHandle");
  }
  std::shared_ptr<Context> ctx;
  try {
    ctx = acquireContext(prop.location.id);
  } catch (...) {
    cu.cuMemRelease(handle);
    throw;
  }
  uint64_t rounded = roundUp(size, vmmGranularity(prop.location.id));
  return std::unique_ptr<Mapping>(new Mapping(std::move(ctx), handle, rounded, false));
}

int Mapping::exportFd() const {
  if (!exportable_) throwInvalid("only memory allocated by this process can be exported");
  int fd = -1;
  ctx_->makeCurrent();
  check(api().cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
  return fd;
}

void Mapping::checkRange(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    throw NativeError("E_OUT_OF_RANGE", "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                            ") is outside the " + std::to_string(size_) + "-byte allocation");
  }
}

void Mapping::copyFromHost(uint64_t offset, const void* src, uint64_t length) const {
  checkRange(offset, length);
  ctx_->makeCurrent();
  check(api().cuMemcpyHtoD(va_ + offset, src, length), "cuMemcpyHtoD");
}

void Mapping::copyToHost(uint64_t offset, void* dst, uint64_t length) const {
  checkRange(offset, length);
  ctx_->makeCurrent();
  check(api().cuMemcpyDtoH(dst, va_ + offset, length), "cuMemcpyDtoH");
}

void Mapping::fill(uint64_t offset, uint64_t length, uint8_t value) const {
  checkRange(offset, length);
  ctx_->makeCurrent();
  check(api().cuMemsetD8(va_ + offset, value, length), "cuMemsetD8");
  check(api().cuCtxSynchronize(), "cuCtxSynchronize");
}

HeldHandle::HeldHandle(int fd) : handle_(importHandle(fd)) {}

HeldHandle::~HeldHandle() { api().cuMemRelease(handle_); }

}  // namespace vsnap::cuda
