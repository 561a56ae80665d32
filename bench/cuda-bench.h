// What the single-file CUDA driver benches (bench/vmm-interference.cu, bench/import-pipeline.cu)
// share: a driver call that fails ends the program with its name and error, a wall clock, GPU
// 0's primary context and the properties of the memory they make and map there.
#pragma once
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                   \
  do {                                                                          \
    CUresult r_ = (x);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                   \
      const char* s_ = nullptr;                                                 \
      cuGetErrorString(r_, &s_);                                                \
      std::fprintf(stderr, "%s failed: %s (%d)\n", #x, s_ ? s_ : "?", (int)r_); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

using Clock = std::chrono::steady_clock;
// Seconds since t.
static inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Device memory on GPU 0; `exportable` asks for POSIX fds (the engine's memory, as vLLM's
// allocator makes it where vsnap can export it).
static inline CUmemAllocationProp prop(bool exportable) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  if (exportable) p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// Read and write access for GPU 0.
static inline CUmemAccessDesc access() {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

// Initialises the driver and makes GPU 0's primary context current on this thread.
static inline CUcontext context() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  return ctx;
}
