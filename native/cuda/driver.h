// The CUDA driver, loaded with dlopen on first use. Entry points are resolved through
// cuGetProcAddress into one table; nothing in the addon links against libcuda, and this
// folder (native/cuda/) is the only code that calls the driver.
#pragma once

#include <cuda.h>

#include <string>

namespace vsnap::cuda {

// Whether the driver could be loaded and initialised, and if not, why.
struct Status {
  bool available = false;
  std::string reason;          // empty when available
  int driverVersion = 0;       // cuDriverGetVersion, e.g. 13000; 0 when unknown
  std::string library;         // the library that was opened
  bool checkpointApi = false;  // cuCheckpointProcess* present (driver r570+)
};

// Loads and initialises the driver once (thread-safe) and reports the outcome.
const Status& status();

#define VSNAP_CUDA_FUNCTIONS(X)                                                              \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)        \
  X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceGetAttribute)           \
  X(cuDeviceTotalMem) X(cuDeviceGetPCIBusId) X(cuDevicePrimaryCtxRetain)                     \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuMemGetInfo)          \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease)                            \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                          \
  X(cuMemGetAllocationPropertiesFromHandle) X(cuMemAddressReserve) X(cuMemAddressFree)        \
  X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemHostRegister) X(cuMemHostUnregister)     \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemsetD8)     \
  X(cuMemsetD8Async)                                                                          \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate)                \
  X(cuEventRecord) X(cuEventSynchronize) X(cuEventDestroy) X(cuCtxSynchronize)               \
  /* the GPU digest (native/digest) */                                                        \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) X(cuMemAlloc) \
  X(cuMemFree) X(cuMemcpyDtoDAsync) X(cuEventElapsedTime)                                   \
  /* peer copies between GPUs (native/cuda/peer) */                                           \
  VSNAP_CUDA_PEER_FUNCTIONS(X)

#define VSNAP_CUDA_PEER_FUNCTIONS(X) \
  X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess) X(cuStreamWaitEvent) X(cuEventQuery)

// Present only on newer drivers; null when absent.
#define VSNAP_CUDA_OPTIONAL_FUNCTIONS(X)                                                      \
  X(cuCheckpointProcessGetState) X(cuCheckpointProcessLock) X(cuCheckpointProcessCheckpoint)  \
  X(cuCheckpointProcessRestore) X(cuCheckpointProcessUnlock)

struct Api {
#define VSNAP_DECLARE(name) decltype(&::name) name = nullptr;
  VSNAP_CUDA_FUNCTIONS(VSNAP_DECLARE)
  VSNAP_CUDA_OPTIONAL_FUNCTIONS(VSNAP_DECLARE)
#undef VSNAP_DECLARE
};

// The loaded table. Throws E_CUDA_UNAVAILABLE (with status().reason) when there is none.
const Api& api();

// Throws E_CUDA for a failed driver call, naming the call and the driver's error.
void check(CUresult result, const char* call);

}  // namespace vsnap::cuda

