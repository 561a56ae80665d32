#include "cuda/devices.h"

#include <cstdio>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/driver.h"
#include "cuda/exportable.h"

namespace vsnap::cuda {
namespace {

CUdevice deviceHandle(int ordinal) {
  int count = deviceCount();
  if (ordinal < 0 || ordinal >= count) {
    throwInvalid("no CUDA device " + std::to_string(ordinal) + " (this process sees " +
                 std::to_string(count) + ")");
  }
  CUdevice dev;
  check(api().cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  return dev;
}

int attribute(CUdevice dev, CUdevice_attribute attr) {
  int value = 0;
  check(api().cuDeviceGetAttribute(&value, attr, dev), "cuDeviceGetAttribute");
  return value;
}

std::string formatUuid(const CUuuid& id) {
  const auto* b = reinterpret_cast<const unsigned char*>(id.bytes);
  char out[64];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

}  // namespace

int deviceCount() {
  int count = 0;
  check(api().cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

uint64_t vmmGranularity(int ordinal) {
  deviceHandle(ordinal);
  CUmemAllocationProp prop = exportableAllocation(ordinal);
  size_t granularity = 0;
  check(api().cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  return granularity;
}

DeviceInfo deviceInfo(int ordinal, bool withFreeMemory) {
  const Api& cu = api();
  CUdevice dev = deviceHandle(ordinal);
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {0};
  check(cu.cuDeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
  info.name = name;
  CUuuid uuid;
  check(cu.cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
  info.uuid = formatUuid(uuid);
  char bus[64] = {0};
  check(cu.cuDeviceGetPCIBusId(bus, sizeof bus - 1, dev), "cuDeviceGetPCIBusId");
  info.pciBusId = bus;
  info.computeCapabilityMajor = attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.computeCapabilityMinor = attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  size_t total = 0;
  check(cu.cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem");
  info.totalMemory = total;
  info.vmmSupported = attribute(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
  info.posixFdHandlesSupported =
      attribute(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0;
  if (info.vmmSupported) info.vmmGranularity = vmmGranularity(ordinal);
  if (withFreeMemory) {
    auto ctx = acquireContext(ordinal);
    ctx->makeCurrent();
    size_t freeBytes = 0, totalBytes = 0;
    check(cu.cuMemGetInfo(&freeBytes, &totalBytes), "cuMemGetInfo");
    info.freeMemory = static_cast<int64_t>(freeBytes);
  }
  return info;
}

}  // namespace vsnap::cuda
