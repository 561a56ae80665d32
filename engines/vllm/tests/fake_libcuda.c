/* A stand-in for libcuda.so.1 with the entry points the plugin's CudaDriver uses (drivers.py, the
 * digest's included), for CPU-only tests and for bench/plugin-driver.py: every call does nothing
 * and answers CUDA_SUCCESS with made-up handles, addresses and descriptor numbers, so what a
 * caller measures against it is the caller's own cost (ctypes, Python). It keeps what a test
 * needs to check the calls: a count per entry point, the last allocation properties and access
 * descriptor passed, and a thread's current context (none until cuCtxSetCurrent, as in a thread
 * the driver has not seen).
 *
 * Built with: cc -O2 -shared -fPIC -o libfakecuda.so fake_libcuda.c
 *
 * Test controls (not CUDA): fake_fail(name, code, times) makes the next `times` calls of `name`
 * answer `code` (times < 0: every call), fake_fail_after(name, skip, code, times) the same after
 * `skip` calls that succeed; fake_calls(name) counts calls; fake_reset() clears all;
 * fake_set_no_context(flag) makes every thread start without a current context (1, the default)
 * or with one (0); fake_drop_context() drops the calling thread's; fake_last_prop /
 * fake_last_access copy what the last cuMemCreate / cuMemSetAccess got.
 * Descriptors are not real: fake_export_real(1) makes cuMemExportToShareableHandle return a real
 * one (a new descriptor of /dev/null), for code that closes what it exports.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef uint64_t Handle;

enum { SUCCESS = 0, INVALID_VALUE = 1, INVALID_CONTEXT = 201 };

struct Location { int type; int id; };
struct Prop {
  int type;
  int requestedHandleTypes;
  struct Location location;
  void* win32HandleMetaData;
  unsigned char compressionType, gpuDirectRDMACapable;
  unsigned short usage;
  unsigned char reserved[4];
};
struct Access { struct Location location; int flags; };

#define MAX_NAMES 48
static struct { char name[48]; long calls; CUresult fail; long times; long skip; } table[MAX_NAMES];
static int names;
static struct Prop last_prop;
static struct Access last_access;
static Handle next_handle = 0x1000;
static CUdeviceptr next_va = 0x7f0000000000ull;
static int next_fd = 1000;
static int export_real;
static int start_without_context = 1;
static __thread void* current;
static __thread int seen;
static char ctx_storage;

static int slot(const char* name) {
  for (int i = 0; i < names; i++)
    if (strcmp(table[i].name, name) == 0) return i;
  if (names == MAX_NAMES) return MAX_NAMES - 1;
  strncpy(table[names].name, name, sizeof table[names].name - 1);
  return names++;
}

/* Calls may come from several threads at once (the plugin imports on a few). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Counts the call; the injected failure, if any, else SUCCESS. */
static CUresult enter(const char* name) {
  pthread_mutex_lock(&lock);
  CUresult r = SUCCESS;
  int i = slot(name);
  table[i].calls++;
  if (table[i].fail && table[i].times != 0) {
    if (table[i].skip > 0) {
      table[i].skip--;
    } else {
      if (table[i].times > 0) table[i].times--;
      r = table[i].fail;
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}

static CUresult need_context(const char* name) {
  CUresult r = enter(name);
  if (r) return r;
  if (!seen) {
    seen = 1;
    if (!start_without_context) current = &ctx_storage;
  }
  return current ? SUCCESS : INVALID_CONTEXT;
}

void fake_fail(const char* name, int code, long times) {
  int i = slot(name);
  table[i].fail = code;
  table[i].times = times;
  table[i].skip = 0;
}
void fake_fail_after(const char* name, long skip, int code, long times) {
  fake_fail(name, code, times);
  table[slot(name)].skip = skip;
}
long fake_calls(const char* name) { return table[slot(name)].calls; }
void fake_reset(void) {
  memset(table, 0, sizeof table);
  names = 0;
  memset(&last_prop, 0, sizeof last_prop);
  memset(&last_access, 0, sizeof last_access);
  export_real = 0;
  start_without_context = 1;
  current = 0; /* the calling thread starts over too */
  seen = 0;
}
void fake_set_no_context(int flag) { start_without_context = flag; }
void fake_export_real(int flag) { export_real = flag; }
void fake_last_prop(struct Prop* out) { *out = last_prop; }
void fake_last_access(struct Access* out) { *out = last_access; }
/* Drops this thread's current context (as a cuCtxSetCurrent(NULL) elsewhere would). */
void fake_drop_context(void) { current = 0; seen = 1; }

CUresult cuInit(unsigned flags) { (void)flags; return enter("cuInit"); }
CUresult cuGetErrorName(CUresult error, const char** out) {
  enter("cuGetErrorName");
  switch (error) {
    case INVALID_VALUE: *out = "CUDA_ERROR_INVALID_VALUE"; break;
    case INVALID_CONTEXT: *out = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case 2: *out = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 800: *out = "CUDA_ERROR_NOT_PERMITTED"; break;
    case 801: *out = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *out = 0; return INVALID_VALUE;
  }
  return SUCCESS;
}
CUresult cuDeviceGet(int* dev, int ordinal) { CUresult r = enter("cuDeviceGet"); if (!r) *dev = ordinal; return r; }
CUresult cuDeviceGetUuid_v2(char* uuid, int dev) {
  CUresult r = enter("cuDeviceGetUuid_v2");
  if (!r) for (int i = 0; i < 16; i++) uuid[i] = (char)(dev * 16 + i);
  return r;
}
CUresult cuCtxGetCurrent(void** ctx) {
  CUresult r = enter("cuCtxGetCurrent");
  if (r) return r;
  if (!seen) {
    seen = 1;
    if (!start_without_context) current = &ctx_storage;
  }
  *ctx = current;
  return SUCCESS;
}
CUresult cuCtxSetCurrent(void* ctx) { CUresult r = enter("cuCtxSetCurrent"); if (!r) { seen = 1; current = ctx; } return r; }
CUresult cuCtxSynchronize(void) { return need_context("cuCtxSynchronize"); }
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) { (void)dev; CUresult r = enter("cuDevicePrimaryCtxRetain"); if (!r) *ctx = &ctx_storage; return r; }
CUresult cuMemGetAllocationGranularity(size_t* g, const struct Prop* prop, int option) {
  (void)prop; (void)option;
  CUresult r = need_context("cuMemGetAllocationGranularity");
  if (!r) *g = 2u << 20;
  return r;
}
CUresult cuMemCreate(Handle* handle, size_t size, const struct Prop* prop, uint64_t flags) {
  (void)size; (void)flags;
  CUresult r = need_context("cuMemCreate");
  if (r) return r;
  last_prop = *prop;
  *handle = next_handle++;
  return SUCCESS;
}
CUresult cuMemRelease(Handle handle) { (void)handle; return need_context("cuMemRelease"); }
CUresult cuMemExportToShareableHandle(void* out, Handle handle, int type, uint64_t flags) {
  (void)handle; (void)type; (void)flags;
  CUresult r = need_context("cuMemExportToShareableHandle");
  if (r) return r;
  *(int*)out = export_real ? open("/dev/null", O_RDONLY | O_CLOEXEC) : next_fd++;
  return SUCCESS;
}
CUresult cuMemImportFromShareableHandle(Handle* handle, void* os_handle, int type) {
  (void)os_handle; (void)type;
  CUresult r = enter("cuMemImportFromShareableHandle"); /* the plugin imports without making a context current */
  if (!r) *handle = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
  return r;
}
CUresult cuMemAddressReserve(CUdeviceptr* va, size_t size, size_t align, CUdeviceptr addr, uint64_t flags) {
  (void)align; (void)addr; (void)flags;
  CUresult r = need_context("cuMemAddressReserve");
  if (!r) { *va = next_va; next_va += (size + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1); }
  return r;
}
CUresult cuMemAddressFree(CUdeviceptr va, size_t size) { (void)va; (void)size; return need_context("cuMemAddressFree"); }
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, Handle handle, uint64_t flags) {
  (void)va; (void)size; (void)offset; (void)handle; (void)flags;
  return need_context("cuMemMap");
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) { (void)va; (void)size; return need_context("cuMemUnmap"); }
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const struct Access* desc, size_t count) {
  (void)va; (void)size; (void)count;
  CUresult r = need_context("cuMemSetAccess");
  if (!r) last_access = *desc;
  return r;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t size) { (void)dst; (void)src; (void)size; return need_context("cuMemcpyDtoD_v2"); }
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t size) { (void)dst; (void)src; (void)size; return need_context("cuMemcpy"); }
CUresult cuMemHostRegister_v2(void* p, size_t size, unsigned int flags) { (void)p; (void)size; (void)flags; return need_context("cuMemHostRegister_v2"); }
CUresult cuMemHostUnregister(void* p) { (void)p; return need_context("cuMemHostUnregister"); }
CUresult cuMemGetAllocationPropertiesFromHandle(struct Prop* prop, Handle handle) {
  (void)handle;
  CUresult r = need_context("cuMemGetAllocationPropertiesFromHandle");
  if (r) return r;
  memset(prop, 0, sizeof *prop);
  prop->type = 1;
  prop->requestedHandleTypes = 1;
  return SUCCESS;
}

/* The digest's entry points (CudaDriver.digest_start): a module, a function and a stream are made-up
 * handles, device memory a made-up address; launches and copies do nothing (the partial sums read
 * back are whatever the caller's buffer held). */
CUresult cuModuleLoadData(void** module, const void* image) {
  (void)image;
  CUresult r = need_context("cuModuleLoadData");
  if (!r) *module = &ctx_storage;
  return r;
}
CUresult cuModuleGetFunction(void** fn, void* module, const char* name) {
  (void)module; (void)name;
  CUresult r = need_context("cuModuleGetFunction");
  if (!r) *fn = &ctx_storage;
  return r;
}
CUresult cuStreamCreate(void** stream, unsigned flags) {
  (void)flags;
  CUresult r = need_context("cuStreamCreate");
  if (!r) *stream = &ctx_storage;
  return r;
}
CUresult cuStreamSynchronize(void* stream) { (void)stream; return need_context("cuStreamSynchronize"); }
CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t size) {
  CUresult r = need_context("cuMemAlloc_v2");
  if (!r) { *ptr = next_va; next_va += (size + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1); }
  return r;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) { (void)ptr; return need_context("cuMemFree_v2"); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t size, void* stream) {
  (void)dst; (void)src; (void)size; (void)stream;
  return need_context("cuMemcpyHtoDAsync_v2");
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t size, void* stream) {
  (void)dst; (void)src; (void)size; (void)stream;
  return need_context("cuMemcpyAsync");
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t size, void* stream) {
  (void)dst; (void)src; (void)size; (void)stream;
  return need_context("cuMemcpyDtoHAsync_v2");
}
CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared,
                        void* stream, void** params, void** extra) {
  (void)fn; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream; (void)params; (void)extra;
  return need_context("cuLaunchKernel");
}
