// Streams, events, asynchronous copies and page-locking of host memory.
#pragma once

#include <cstdint>
#include <memory>

namespace vsnap::cuda {

class Context;

class Stream {
 public:
  explicit Stream(std::shared_ptr<Context> ctx);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void copyToDevice(uint64_t dst, const void* src, uint64_t length);
  void copyToHost(void* dst, uint64_t src, uint64_t length);
  void synchronize();

 private:
  friend class Event;
  std::shared_ptr<Context> ctx_;
  void* stream_ = nullptr;  // CUstream
};

// Marks a point in a stream; wait() blocks until the work before it has finished.
class Event {
 public:
  explicit Event(std::shared_ptr<Context> ctx);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream& stream);
  void wait();
  // Whether the work before the last record has finished (cuEventQuery; does not block).
  bool done();

 private:
  std::shared_ptr<Context> ctx_;
  void* event_ = nullptr;  // CUevent
  bool pending_ = false;
};

// Page-locks host memory for DMA in every context (CU_MEMHOSTREGISTER_PORTABLE) while the
// object lives. ctx keeps a context alive, since a registration lasts only as long as one.
class HostRegistration {
 public:
  HostRegistration(std::shared_ptr<Context> ctx, void* ptr, uint64_t length);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  std::shared_ptr<Context> ctx_;
  void* ptr_;
};

}  // namespace vsnap::cuda
