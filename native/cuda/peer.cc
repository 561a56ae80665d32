#include "cuda/peer.h"

#include <string>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/driver.h"
#include "cuda/vmm.h"

namespace vsnap::cuda {

bool canAccessPeer(int device, int peer) {
  const Api& cu = api();
  int count = 0;
  check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (device == peer || device < 0 || peer < 0 || device >= count || peer >= count) return false;
  CUdevice a, b;
  check(cu.cuDeviceGet(&a, device), "cuDeviceGet");
  check(cu.cuDeviceGet(&b, peer), "cuDeviceGet");
  int can = 0;
  check(cu.cuDeviceCanAccessPeer(&can, a, b), "cuDeviceCanAccessPeer");
  return can != 0;
}

void enablePeerAccess(const std::shared_ptr<Context>& device, const std::shared_ptr<Context>& peer) {
  if (!canAccessPeer(device->ordinal(), peer->ordinal())) {
    throw NativeError("E_PEER_UNSUPPORTED",
                      "GPU " + std::to_string(device->ordinal()) + " cannot access GPU " + std::to_string(peer->ordinal()) +
                          " directly (cuDeviceCanAccessPeer is 0: no NVLink or PCIe peer-to-peer between them, or IOMMU/ACS "
                          "blocks it). Use another neighbour GPU, or restore from the RAM tier.",
                      {{"device", static_cast<int64_t>(device->ordinal())}, {"peer", static_cast<int64_t>(peer->ordinal())}});
  }
  device->makeCurrent();
  // The peer context is the peer device's primary context, retained by `peer`.
  CUdevice dev;
  check(api().cuDeviceGet(&dev, peer->ordinal()), "cuDeviceGet");
  CUcontext peerCtx = nullptr;
  peer->makeCurrent();
  check(api().cuCtxGetCurrent(&peerCtx), "cuCtxGetCurrent");
  device->makeCurrent();
  CUresult r = api().cuCtxEnablePeerAccess(peerCtx, 0);
  if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return;
  check(r, "cuCtxEnablePeerAccess");
}

void grantAccess(const Mapping& mapping, int device) {
  if (device == mapping.device()) return;
  mapping.context()->makeCurrent();
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(api().cuMemSetAccess(mapping.address(), mapping.size(), &access, 1), "cuMemSetAccess");
}

CopyStream::CopyStream(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
  ctx_->makeCurrent();
  CUstream s = nullptr;
  check(api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  stream_ = s;
}

CopyStream::~CopyStream() {
  ctx_->makeCurrent();
  api().cuStreamSynchronize(static_cast<CUstream>(stream_));
  api().cuStreamDestroy(static_cast<CUstream>(stream_));
}

int CopyStream::device() const { return ctx_->ordinal(); }

void CopyStream::hostToDevice(uint64_t dst, const void* src, uint64_t length) {
  ctx_->makeCurrent();
  check(api().cuMemcpyHtoDAsync(dst, src, length, static_cast<CUstream>(stream_)), "cuMemcpyHtoDAsync");
}

void CopyStream::deviceToDevice(uint64_t dst, uint64_t src, uint64_t length) {
  ctx_->makeCurrent();
  check(api().cuMemcpyDtoDAsync(dst, src, length, static_cast<CUstream>(stream_)), "cuMemcpyDtoDAsync");
}

void CopyStream::waitFor(Marker& marker) {
  ctx_->makeCurrent();
  check(api().cuStreamWaitEvent(static_cast<CUstream>(stream_), static_cast<CUevent>(marker.event_), 0), "cuStreamWaitEvent");
}

void CopyStream::synchronize() {
  ctx_->makeCurrent();
  check(api().cuStreamSynchronize(static_cast<CUstream>(stream_)), "cuStreamSynchronize");
}

Marker::Marker(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
  ctx_->makeCurrent();
  CUevent e = nullptr;
  check(api().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  event_ = e;
}

Marker::~Marker() {
  ctx_->makeCurrent();
  if (pending_) api().cuEventSynchronize(static_cast<CUevent>(event_));
  api().cuEventDestroy(static_cast<CUevent>(event_));
}

void Marker::record(CopyStream& stream) {
  ctx_->makeCurrent();
  check(api().cuEventRecord(static_cast<CUevent>(event_), static_cast<CUstream>(stream.stream_)), "cuEventRecord");
  pending_ = true;
}

void Marker::wait() {
  if (!pending_) return;
  ctx_->makeCurrent();
  pending_ = false;
  check(api().cuEventSynchronize(static_cast<CUevent>(event_)), "cuEventSynchronize");
}

}  // namespace vsnap::cuda
