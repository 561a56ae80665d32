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

}  // namespace vsnap::cuda
