// Multi-path hydrate: copies verified RAM-tier bytes into ONE target GPU over two paths at once,
// host -> target directly, and host -> a ring of staging slots in a neighbour GPU -> peer copy
// -> target, so two PCIe links feed one GPU (docs/multipath.md has the design).
//
// Scheduling is work-stealing from one queue of equal chunks: the direct worker takes from the
// front, the relay worker from the back, each only when it has a free slot, so each path takes
// chunks at the rate it completes them. Back-pressure: a ring slot is reused only after the
// peer copy out of it has completed. The relay path can be cancelled at any time (the
// neighbour's memory is needed) or can fail: its in-flight chunks are drained, any that did not
// complete go back to the queue, its ring is released, and the direct path finishes the rest. A
// failure of the direct path fails the job. A job reports success only when every chunk was
// confirmed complete on one of the paths.
//
// The copies themselves are a MultipathBackend: CUDA streams and events on two GPUs
// (multipath_cuda.cc), or host memory (hostMultipathBackend) that runs the same scheduler on
// the CPU for tests, with faults.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace vsnap::cuda {
class Mapping;
}

namespace vsnap::transfer {

class Region;

struct MultipathChunk {
  uint32_t task;
  uint64_t offset;
  uint64_t length;
};

// Asynchronous copies on two paths. Each path has numbered slots; a slot holds at most one chunk
// in flight, and the scheduler calls *Wait(slot) before it reuses it.
class MultipathBackend {
 public:
  virtual ~MultipathBackend() = default;
  virtual uint32_t directSlots() const = 0;
  virtual uint32_t relaySlots() const = 0;  // 0: no relay path (the neighbour is unusable)
  // host source of the chunk -> target region, asynchronously.
  virtual void directCopy(uint32_t slot, const MultipathChunk& c) = 0;
  // Blocks until the slot's copy is complete; throws if it failed.
  virtual void directWait(uint32_t slot) = 0;
  // host source -> ring slot on the neighbour -> target region, asynchronously.
  virtual void relayCopy(uint32_t slot, const MultipathChunk& c) = 0;
  virtual void relayWait(uint32_t slot) = 0;
  // Frees the ring (the neighbour's memory); called once, after every relay copy was waited for.
  virtual void releaseRelay() = 0;
  // Bytes of neighbour memory the ring holds now (0 once released).
  virtual uint64_t ringBytes() const = 0;
  // Why there is no relay path (relaySlots() == 0), for the report; empty otherwise.
  virtual std::string relayNote() const { return {}; }
};

// When a path was busy, in seconds since the job started: first copy issued, last copy seen
// complete, the time at least one of its copies was in flight, and the most in flight at once.
struct PathTimeline {
  double firstStart = -1;
  double lastEnd = -1;
  double busySeconds = 0;
  uint32_t maxInFlight = 0;
};

struct MultipathStats {
  PathTimeline direct;
  PathTimeline relay;
  uint64_t bytesDirect = 0;
  uint64_t bytesRelay = 0;
  uint32_t chunksDirect = 0;
  uint32_t chunksRelay = 0;
  uint32_t requeued = 0;        // chunks the relay path gave back (cancelled or failed)
  uint32_t maxRelayInFlight = 0;
  bool relayUsed = false;       // the relay path started
  bool relayCancelled = false;  // cancelRelay() stopped it before the queue ran dry
  std::string relayError;       // why the relay path stopped early, when it failed
};

// A fixed schedule for the host backend's tests (its faults), so that which path takes which
// chunk does not depend on how the two worker threads happen to be scheduled:
//  relayChunks N > 0: the relay path takes the last N chunks (all, if there are fewer) and no
//    others, and the direct path takes none before it has them (or the relay path ended);
//  holdRelay: a neighbour too busy to finish a copy. The direct path takes no chunk before the
//    relay path has filled its ring (or ended), and a relay copy completes only once the direct
//    path has taken every other chunk, the relay path is released, or the job stops.
// With holdRelay and relayChunks above the ring's slots, the job waits for cancel() or cancelRelay().
struct MultipathTestSchedule {
  uint32_t relayChunks = 0;
  bool holdRelay = false;
};

class MultipathJob {
 public:
  // One task per target region: its size; chunks of chunkSize (the last one shorter).
  MultipathJob(std::string label, std::vector<uint64_t> taskSizes, uint64_t chunkSize, std::shared_ptr<MultipathBackend> backend);
  ~MultipathJob();

  // Runs to completion on worker threads; throws NativeError. tick is called about every 100 ms.
  void run(const std::function<void()>& tick);
  void cancel();       // the whole job (E_ABORTED)
  void cancelRelay();  // the neighbour path only; the direct path finishes the rest
  void setTestSchedule(const MultipathTestSchedule& schedule) { schedule_ = schedule; }  // before run()

  uint64_t bytesTotal() const { return bytesTotal_; }
  uint64_t bytesDone() const { return bytesDone_.load(); }
  MultipathStats stats();

 private:
  enum class End { Front, Back };
  std::optional<MultipathChunk> take(End end, bool relay);
  double now() const;
  // A copy issued on / seen complete on a path (its timeline; inFlight is the count after).
  void issued(PathTimeline& t, uint32_t inFlight, double& busySince);
  void retired(PathTimeline& t, uint32_t inFlight, double busySince);
  void giveBack(const MultipathChunk& c);
  void holdRelay();
  void directWorker();
  void relayWorker();
  void fail(const NativeError& e);
  bool stopping() const { return cancelled_.load() || failed_.load(); }

  std::string label_;
  uint64_t chunkSize_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::shared_ptr<MultipathBackend> backend_;
  uint64_t bytesTotal_ = 0;
  std::atomic<uint64_t> bytesDone_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> relayCancel_{false};
  MultipathTestSchedule schedule_;

  std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::deque<MultipathChunk> queue_;
  bool relayActive_ = false;  // the relay worker may still give chunks back
  uint32_t relayTaken_ = 0;     // chunks the relay path took (schedule_.relayChunks)
  bool relayHolding_ = false;   // the relay path filled its ring (schedule_.holdRelay)
  MultipathStats stats_;
  std::optional<NativeError> error_;
};

// A backend in host memory for tests: targets are host regions, sources host pointers, the
// "ring" is host memory. Copies are deferred until their wait (as asynchronous copies are), so a
// slot reused before its wait is caught (E_INTERNAL). Faults: the relay (or direct) copy number
// N (1-based, 0: never) fails at its wait; each copy sleeps delayMs at its wait.
struct HostBackendFaults {
  uint32_t failRelayAt = 0;
  uint32_t failDirectAt = 0;
  uint32_t relayDelayMs = 0;
  uint32_t directDelayMs = 0;
};

class HostMultipathBackend;
std::shared_ptr<HostMultipathBackend> hostMultipathBackend(std::vector<std::unique_ptr<Region>> targets, std::vector<const char*> sources,
                                                           uint32_t directSlots, uint32_t relaySlots, uint64_t slotSize,
                                                           HostBackendFaults faults);
std::shared_ptr<MultipathBackend> asBackend(std::shared_ptr<HostMultipathBackend> backend);

// The CUDA backend: targets are mappings on one GPU, sources page-locked (portable) host memory.
// neighbour < 0: direct path only. The ring (relaySlots x slotSize on the neighbour) is
// allocated now; when the neighbour cannot give the memory or cannot reach the target, the job
// runs on the direct path alone and relayNote() says why, unless requireRelay (then it throws).
struct CudaMultipathOptions {
  int neighbour = -1;
  uint32_t directSlots = 4;
  uint32_t directStreams = 2;  // the direct path's slots round-robin over this many streams
  uint32_t relaySlots = 4;
  uint64_t slotSize = 64ull << 20;
  bool requireRelay = false;
};
// The neighbour's primary context (and the target's peer access to it) is kept between jobs, so
// a restore does not pay for creating it (and mapping the pinned RAM tier into it) and
// destroying it; this frees what is kept (the next job creates it again).
void releaseWarmNeighbours();
std::shared_ptr<MultipathBackend> cudaMultipathBackend(std::vector<std::shared_ptr<cuda::Mapping>> targets,
                                                       std::vector<const char*> sources, const CudaMultipathOptions& options);

}  // namespace vsnap::transfer
