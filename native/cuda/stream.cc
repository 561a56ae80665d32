#include "cuda/stream.h"

#include "cuda/context.h"
#include "cuda/driver.h"

namespace vsnap::cuda {

Stream::Stream(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
  ctx_->makeCurrent();
  CUstream s = nullptr;
  check(api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  stream_ = s;
}

Stream::~Stream() {
  ctx_->makeCurrent();
  api().cuStreamDestroy(static_cast<CUstream>(stream_));
}


void Stream::copyToDevice(uint64_t dst, const void* src, uint64_t length) {
  ctx_->makeCurrent();
  check(api().cuMemcpyHtoDAsync(dst, src, length, static_cast<CUstream>(stream_)), "cuMemcpyHtoDAsync");
}

void Stream::copyToHost(void* dst, uint64_t src, uint64_t length) {
  ctx_->makeCurrent();
  check(api().cuMemcpyDtoHAsync(dst, src, length, static_cast<CUstream>(stream_)), "cuMemcpyDtoHAsync");
}

void Stream::synchronize() {
  ctx_->makeCurrent();
  check(api().cuStreamSynchronize(static_cast<CUstream>(stream_)), "cuStreamSynchronize");
}

Event::Event(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
  ctx_->makeCurrent();
  CUevent e = nullptr;
  check(api().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  event_ = e;
}

Event::~Event() {
  ctx_->makeCurrent();
  if (pending_) api().cuEventSynchronize(static_cast<CUevent>(event_));
  api().cuEventDestroy(static_cast<CUevent>(event_));
}

void Event::record(Stream& stream) {
  ctx_->makeCurrent();
  check(api().cuEventRecord(static_cast<CUevent>(event_), static_cast<CUstream>(stream.stream_)), "cuEventRecord");
  pending_ = true;
}

void Event::wait() {
  if (!pending_) return;
  ctx_->makeCurrent();
  pending_ = false;
  check(api().cuEventSynchronize(static_cast<CUevent>(event_)), "cuEventSynchronize");
}

bool Event::done() {
  if (!pending_) return true;
  ctx_->makeCurrent();
  CUresult r = api().cuEventQuery(static_cast<CUevent>(event_));
  if (r == CUDA_ERROR_NOT_READY) return false;
  pending_ = false;
  check(r, "cuEventQuery");
  return true;
}

HostRegistration::HostRegistration(std::shared_ptr<Context> ctx, void* ptr, uint64_t length)
    : ctx_(std::move(ctx)), ptr_(ptr) {
  ctx_->makeCurrent();
  check(api().cuMemHostRegister(ptr, length, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister");
}

HostRegistration::~HostRegistration() {
  ctx_->makeCurrent();
  api().cuMemHostUnregister(ptr_);
}

}  // namespace vsnap::cuda
