#include "cuda/vmm.h"

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/devices.h"
#include "cuda/driver.h"
#include "cuda/exportable.h"
#include "cuda/vmm_batch.h"
#include "cuda/vmm_timing.h"

namespace vsnap::cuda {
namespace {
using vmm::addressFree;
using vmm::release;
using vmm::unmap;

uint64_t roundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Imports another process's exported (POSIX-FD) handle; the descriptor is not consumed.
CUmemGenericAllocationHandle importHandle(int fd) {
  CUmemGenericAllocationHandle handle = 0;
  VmmTimer timer(VmmStep::Import);
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
  uint64_t granularity;
  {
    VmmTimer timer(VmmStep::Setup);
    granularity = vmmGranularity(device_);
  }
  CUresult r;
  {
    VmmTimer timer(VmmStep::Reserve);
    r = cu.cuMemAddressReserve(&va, size_, granularity, 0, 0);
    if (r != CUDA_SUCCESS) timer.fail();
  }
  if (r != CUDA_SUCCESS) {
    release(handle_);
    check(r, "cuMemAddressReserve");
  }
  va_ = va;
  {
    VmmTimer timer(VmmStep::Map);
    r = cu.cuMemMap(va, size_, 0, handle_, 0);
    if (r != CUDA_SUCCESS) timer.fail();
  }
  if (r == CUDA_SUCCESS) {
    mapped_ = true;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    VmmTimer timer(VmmStep::Access);
    r = cu.cuMemSetAccess(va, size_, &access, 1);
    if (r != CUDA_SUCCESS) timer.fail();
  }
  if (r != CUDA_SUCCESS) {
    if (mapped_) unmap(va, size_);
    addressFree(va, size_);
    release(handle_);
    check(r, mapped_ ? "cuMemSetAccess" : "cuMemMap");
  }
}

Mapping::Mapping(std::shared_ptr<void> owner, std::shared_ptr<Context> ctx, uint64_t va, uint64_t size)
    : ctx_(std::move(ctx)), device_(ctx_->ordinal()), va_(va), size_(size), owner_(std::move(owner)) {}

std::shared_ptr<Mapping> Mapping::view(std::shared_ptr<void> owner, std::shared_ptr<Context> ctx, uint64_t va, uint64_t size) {
  return std::shared_ptr<Mapping>(new Mapping(std::move(owner), std::move(ctx), va, size));
}

std::shared_ptr<Mapping> Mapping::exportableView(std::shared_ptr<void> owner, std::shared_ptr<Context> ctx, uint64_t va, uint64_t size, uint64_t handle) {
  std::shared_ptr<Mapping> m(new Mapping(std::move(owner), std::move(ctx), va, size));
  m->handle_ = handle;
  m->exportable_ = true;
  return m;
}

Mapping::~Mapping() {
  if (owner_) return;  // a view: the batch that owns the mapping undoes it
  ctx_->makeCurrent();
  if (mapped_) unmap(va_, size_);
  addressFree(va_, size_);
  if (exportable_) {
    api().cuMemRelease(handle_);  // cuMemCreate is not a timed step: nor is its release
  } else {
    release(handle_);
  }
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
  vmm::Imported imported = vmm::importFd(fd);
  std::shared_ptr<Context> ctx;
  uint64_t rounded = 0;
  try {
    VmmTimer timer(VmmStep::Setup);
    ctx = acquireContext(imported.device);
    rounded = roundUp(size, vmmGranularity(imported.device));
  } catch (...) {
    release(imported.handle);
    throw;
  }
  return std::unique_ptr<Mapping>(new Mapping(std::move(ctx), imported.handle, rounded, false));
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

HeldHandle::~HeldHandle() { release(handle_); }

}  // namespace vsnap::cuda
