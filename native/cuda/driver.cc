#include "cuda/driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "common/error.h"

namespace vsnap::cuda {
namespace {

// Entry points are requested with the CUDA 12.0 ABI: every function used here kept its
// signature from 12.0 to the 13.x headers we build with, so any r525+ driver works.
constexpr int kAbiVersion = 12000;
constexpr int kCheckpointAbiVersion = 12080;

Api gApi;
Status gStatus;
std::once_flag gOnce;

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

std::string resultName(CUresult r) {
  const char* name = nullptr;
  if (gApi.cuGetErrorName && gApi.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
  return "CUresult " + std::to_string(static_cast<int>(r));
}

void load() {
  const char* override = std::getenv("VSNAP_LIBCUDA");
  gStatus.library = override && *override ? override : "libcuda.so.1";
  void* lib = dlopen(gStatus.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    gStatus.reason = "could not load " + gStatus.library + " (" + (err ? err : "unknown") +
                     "): no NVIDIA driver is installed or visible to this process";
    return;
  }
  auto getProc = reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!getProc) {
    gStatus.reason = gStatus.library + " has no cuGetProcAddress_v2: the driver is older than "
                     "CUDA 12.0 (r525); upgrade the NVIDIA driver";
    return;
  }
  std::string missing;
  auto resolve = [&](const char* name, void** slot, int version, bool required) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = getProc(name, slot, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS) {
      *slot = nullptr;
      if (required) missing += std::string(missing.empty() ? "" : ", ") + name;
    }
  };
#define VSNAP_RESOLVE(name) resolve(#name, reinterpret_cast<void**>(&gApi.name), kAbiVersion, true);
  VSNAP_CUDA_FUNCTIONS(VSNAP_RESOLVE)
#undef VSNAP_RESOLVE
#define VSNAP_RESOLVE_OPT(name) \
  resolve(#name, reinterpret_cast<void**>(&gApi.name), kCheckpointAbiVersion, false);
  VSNAP_CUDA_OPTIONAL_FUNCTIONS(VSNAP_RESOLVE_OPT)
#undef VSNAP_RESOLVE_OPT
  if (!missing.empty()) {
    gStatus.reason = "the driver lacks required entry points (" + missing + "); upgrade the NVIDIA driver";
    return;
  }
  CUresult r = gApi.cuInit(0);
  if (r != CUDA_SUCCESS) {
    gStatus.reason = "cuInit failed with " + resultName(r) +
                     (r == CUDA_ERROR_NO_DEVICE ? ": no CUDA device is visible (check CUDA_VISIBLE_DEVICES)" : "");
    return;
  }
  gApi.cuDriverGetVersion(&gStatus.driverVersion);
  gStatus.checkpointApi = gApi.cuCheckpointProcessLock && gApi.cuCheckpointProcessCheckpoint &&
                          gApi.cuCheckpointProcessRestore && gApi.cuCheckpointProcessUnlock &&
                          gApi.cuCheckpointProcessGetState;
  gStatus.available = true;
}

}  // namespace

const Status& status() {
  std::call_once(gOnce, load);
  return gStatus;
}

const Api& api() {
  const Status& s = status();
  if (!s.available) {
    throw NativeError("E_CUDA_UNAVAILABLE", "CUDA is unavailable: " + s.reason,
                      {{"reason", s.reason}});
  }
  return gApi;
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  std::string name = resultName(result);
  const char* text = nullptr;
  if (gApi.cuGetErrorString) gApi.cuGetErrorString(result, &text);
  std::string hint;
  if (result == CUDA_ERROR_OUT_OF_MEMORY) hint = " Free GPU memory or make the request smaller.";
  throw NativeError("E_CUDA",
                    std::string(call) + " failed: " + name + (text ? std::string(" (") + text + ")" : "") + "." + hint,
                    {{"cudaError", name}, {"cudaErrorNumber", static_cast<int64_t>(result)}, {"call", std::string(call)}});
}

}  // namespace vsnap::cuda
