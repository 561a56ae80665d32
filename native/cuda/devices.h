// What the driver says about each visible GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vsnap::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string uuid;   // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  std::string pciBusId;
  int computeCapabilityMajor = 0;
  int computeCapabilityMinor = 0;
  uint64_t totalMemory = 0;
  int64_t freeMemory = -1;     // -1 unless requested (reading it needs the primary context)
  uint64_t vmmGranularity = 0;  // minimum granularity of POSIX-FD exportable VMM memory
  bool vmmSupported = false;
  bool posixFdHandlesSupported = false;
};

int deviceCount();
DeviceInfo deviceInfo(int ordinal, bool withFreeMemory);

// Minimum allocation granularity for exportable device memory on the device.
uint64_t vmmGranularity(int ordinal);

}  // namespace vsnap::cuda
