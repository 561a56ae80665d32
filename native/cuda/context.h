// Primary contexts, retained while something in the addon needs them and released after,
// so an idle SDK holds no CUDA context (a context alone costs ~500 MiB of GPU memory).
#pragma once

#include <memory>

namespace vsnap::cuda {

class Context {
 public:
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int ordinal() const { return ordinal_; }
  // Makes this context current on the calling thread (cheap; call before driver work).
  void makeCurrent() const;

 private:
  friend std::shared_ptr<Context> acquireContext(int ordinal);
  explicit Context(int ordinal);
  int ordinal_;
  void* ctx_ = nullptr;  // CUcontext
};

// The device's primary context, retained for as long as a returned pointer lives.
// Concurrent holders share one retain. Throws E_CUDA_UNAVAILABLE / E_INVALID_ARGUMENT.
std::shared_ptr<Context> acquireContext(int ordinal);

// Whether the addon currently holds a context on the device.
bool holdsContext(int ordinal);

// Keeps the device's primary context retained between operations until releaseKeptContext, so
// work that comes and goes (a restore of every rank, then the digest of each) does not create
// and destroy a context for a device nothing else holds each time (~0.1-0.3 s per device and
// operation). The SDK lets go when idle (src/transfer/contexts.ts). Throws like acquireContext.
void keepContext(int ordinal);
// Lets go of a context kept by keepContext (it is released once no other holder needs it).
void releaseKeptContext(int ordinal);

}  // namespace vsnap::cuda
