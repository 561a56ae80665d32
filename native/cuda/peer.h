// Copies between two GPUs of one host: peer access between primary contexts, access grants on
// VMM mappings for a second device, and the streams and markers (events) that order host->device
// and device->device copies across devices. Used by the neighbour tier and multi-path hydrate.
#pragma once

#include <cstdint>
#include <memory>

namespace vsnap::cuda {

class Context;
class Mapping;

// cuDeviceCanAccessPeer: whether `device` can read and write memory of `peer` directly
// (NVLink or PCIe peer-to-peer). False when either ordinal is out of range or they are equal.
bool canAccessPeer(int device, int peer);

// Lets `device`'s primary context access `peer`'s (cuCtxEnablePeerAccess; already enabled is
// fine). Throws E_PEER_UNSUPPORTED when the pair cannot access each other.
void enablePeerAccess(const std::shared_ptr<Context>& device, const std::shared_ptr<Context>& peer);

// Grants `device` read/write access to a whole mapping of another device's memory (VMM memory
// is reachable from a device only once cuMemSetAccess names it; peer access is not enough).
void grantAccess(const Mapping& mapping, int device);

class Marker;

// A stream of one context for asynchronous copies; destroyed after everything on it finished.
class CopyStream {
 public:
  explicit CopyStream(std::shared_ptr<Context> ctx);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  int device() const;
  void hostToDevice(uint64_t dst, const void* src, uint64_t length);
  // Any two device addresses this stream's device may access (unified addressing).
  void deviceToDevice(uint64_t dst, uint64_t src, uint64_t length);
  // Work issued after this waits for the marker's point in its (possibly other device's) stream.
  void waitFor(Marker& marker);
  void synchronize();

 private:
  friend class Marker;
  std::shared_ptr<Context> ctx_;
  void* stream_ = nullptr;  // CUstream
};

// An event: record() marks a point in a stream; wait() blocks until the work before it is done.
class Marker {
 public:
  explicit Marker(std::shared_ptr<Context> ctx);
  ~Marker();
  Marker(const Marker&) = delete;
  Marker& operator=(const Marker&) = delete;

  void record(CopyStream& stream);
  // Blocks until done; throws E_CUDA if the work before it failed. No-op when nothing is recorded.
  void wait();
  bool pending() const { return pending_; }

 private:
  friend class CopyStream;
  std::shared_ptr<Context> ctx_;
  void* event_ = nullptr;  // CUevent
  bool pending_ = false;
};

}  // namespace vsnap::cuda
