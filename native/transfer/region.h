// Regions: the memory a transfer reads from (capture) or writes to (hydrate). Three backends
// share one interface: host memory behind a descriptor (memfd; the CPU test suite runs the
// real pipeline on it), device memory this process allocated, and device memory imported
// from another process's exported handle (mapped here for the job, unmapped after).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "common/fd.h"

namespace vsnap::cuda {
class Context;
class Event;
class Mapping;
class Stream;
}  // namespace vsnap::cuda

namespace vsnap::transfer {

// Per worker-thread copy state: one stream and two events (one per staging slot) per device.
class Lane {
 public:
  Lane();
  ~Lane();
  // Waits for everything issued on this lane's streams.
  void synchronize();
  // Likewise, calling drained(device) as each device's stream finishes (in the order they do).
  void synchronize(const std::function<void(int)>& drained);
  cuda::Stream& stream(const std::shared_ptr<cuda::Context>& ctx);
  cuda::Event& event(const std::shared_ptr<cuda::Context>& ctx, int slot);

 private:
  struct PerDevice;
  std::map<int, std::unique_ptr<PerDevice>> devices_;
};

// Where a slot's last copy stands: a device copy is pending until its event completes;
// host copies are synchronous and leave nothing pending.
struct Fence {
  cuda::Event* event = nullptr;
  void wait();
};

class Region {
 public:
  virtual ~Region() = default;
  virtual uint64_t size() const = 0;
  virtual int device() const = 0;  // -1 for host memory
  // Host memory a transfer can use in place (a RAM-tier buffer), or null: a copy reads from
  // it without staging, and a hydrate reads the blob straight into it.
  virtual char* hostMemory() const { return nullptr; }
  const char* hostData() const { return hostMemory(); }
  // Where the region's own bytes are mapped in this process, for readers that work in place
  // (the GPU digest of a RegionSet's regions): host memory, or a device mapping; else null.
  virtual const char* mappedHost() const { return hostMemory(); }
  virtual std::shared_ptr<cuda::Mapping> deviceMapping() const { return nullptr; }
  // The set of regions this one is mapped side by side with, in one address reservation (a
  // RegionSet's batch), or null. Two regions of one span (and one device) whose mapped addresses
  // meet can take one copy across their border: the copy queue joins such copies.
  virtual const void* span() const { return nullptr; }
  // Copies region[offset, +length) to host memory at dst. On return the copy may still be in
  // flight; fence.wait() completes it.
  virtual void copyOut(uint64_t offset, void* dst, uint64_t length, Lane& lane, int slot, Fence& fence) = 0;
  // Copies host memory at src into region[offset, +length), likewise asynchronously.
  virtual void copyIn(uint64_t offset, const void* src, uint64_t length, Lane& lane, int slot, Fence& fence) = 0;
};

// Host memory behind a descriptor, mapped shared for the region's lifetime.
std::unique_ptr<Region> hostRegion(int fd, uint64_t size);
// Device memory this process allocated (kept alive by the shared pointer).
std::unique_ptr<Region> deviceRegion(std::shared_ptr<cuda::Mapping> mapping, uint64_t size);
// Another process's exported device memory: imported and mapped now, unmapped when the
// region is destroyed. The descriptor is not consumed.
std::unique_ptr<Region> importedRegion(int fd, uint64_t size);

}  // namespace vsnap::transfer
