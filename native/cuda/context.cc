#include "cuda/context.h"

#include <map>
#include <mutex>

#include "common/error.h"
#include "cuda/driver.h"

namespace vsnap::cuda {
namespace {
std::mutex gMutex;
std::map<int, std::weak_ptr<Context>> gContexts;
std::mutex gKeptMutex;
std::map<int, std::shared_ptr<Context>> gKept;
}  // namespace

Context::Context(int ordinal) : ordinal_(ordinal) {
  const Api& cu = api();
  int count = 0;
  check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count) {
    throwInvalid("no CUDA device " + std::to_string(ordinal) + " (this process sees " +
                 std::to_string(count) + ")");
  }
  CUdevice dev;
  check(cu.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check(cu.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  ctx_ = ctx;
}

Context::~Context() {
  const Api& cu = api();
  CUdevice dev;
  if (cu.cuDeviceGet(&dev, ordinal_) == CUDA_SUCCESS) cu.cuDevicePrimaryCtxRelease(dev);
}

void Context::makeCurrent() const {
  check(api().cuCtxSetCurrent(static_cast<CUcontext>(ctx_)), "cuCtxSetCurrent");
}

std::shared_ptr<Context> acquireContext(int ordinal) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (auto existing = gContexts[ordinal].lock()) return existing;
  std::shared_ptr<Context> ctx(new Context(ordinal));
  gContexts[ordinal] = ctx;
  return ctx;
}

bool holdsContext(int ordinal) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gContexts.find(ordinal);
  return it != gContexts.end() && !it->second.expired();
}

void keepContext(int ordinal) {
  auto ctx = acquireContext(ordinal);
  std::lock_guard<std::mutex> lock(gKeptMutex);
  gKept[ordinal] = std::move(ctx);
}

void releaseKeptContext(int ordinal) {
  std::shared_ptr<Context> last;  // released outside the lock
  std::lock_guard<std::mutex> lock(gKeptMutex);
  auto it = gKept.find(ordinal);
  if (it == gKept.end()) return;
  last = std::move(it->second);
  gKept.erase(it);
}

}  // namespace vsnap::cuda
