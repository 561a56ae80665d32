// The transfer engine: moves regions to blob files and/or RAM-tier memory (capture), blob files
// to regions (hydrate), only re-hashes blob files (verify), or copies verified RAM-tier memory to
// regions (copy). Work is split into chunks that several worker threads
// take in turn; each worker double-buffers through two staging slots so disk I/O, hashing and
// DMA overlap, across workers and within one (a capture with its hash deferred only lands the
// bytes in RAM-tier memory, no hashing, like copy in reverse). On hydrate every chunk is hashed in host memory
// and compared with the manifest before it is copied: corrupt bytes never reach a region.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "digest/digest.h"
#include "hash/checksum.h"
#include "transfer/region.h"
#include "transfer/staging_pool.h"

namespace vsnap::transfer {

enum class Operation { Capture, Hydrate, Verify, Copy };

struct RegionTask {
  std::string name;                 // the region's key, named in errors
  std::unique_ptr<Region> region;   // the region captured from or written to; null for Verify
  // The region's bytes in RAM-tier host memory (hostData()): Copy reads verified bytes from it;
  // Capture lands the bytes in it (and hashes them there), with or without a blob file.
  std::unique_ptr<Region> hostCopy;
  std::string blobPath;             // Hydrate, Verify; Capture: optional when hostCopy is set
  uint64_t size = 0;
  uint64_t chunkSize = 0;
  std::vector<hash::Digest> expected;   // Hydrate, Verify: one per chunk
  std::vector<hash::Digest> checksums;  // Capture: filled in, one per chunk
  std::vector<digest::Hash128> digests; // Capture with digestChunks: filled in, one per chunk
};

struct JobOptions {
  Operation op = Operation::Capture;
  std::string label;          // the snapshot, named in errors
  uint32_t threads = 0;       // 0: one per core, at most 16
  bool directIo = false;      // O_DIRECT reads (cold data; skips the page cache)
  bool verifyFirst = false;   // Hydrate: verify every chunk of every region before copying any
  // Capture: hash every chunk (XXH3) as it lands. False: the hash is deferred (to persistence),
  // every region lands in its hostCopy only (no blob), and the copies are issued back to back.
  bool hashChunks = true;
  // Capture with hashChunks: also the GPU digest ("vsnap-gd1") of every chunk, taken from the
  // same read as its XXH3 (persisting a capture whose hash was deferred checks both at once).
  bool digestChunks = false;
};

enum class Phase : int { Starting = 0, Verifying = 1, Copying = 2, Flushing = 3, Done = 4 };
const char* phaseName(Phase p);

class TransferJob {
 public:
  TransferJob(JobOptions options, std::vector<RegionTask> tasks, std::shared_ptr<StagingPool> pool);
  ~TransferJob();

  // Runs to completion on the calling thread (plus worker threads); throws NativeError.
  // tick is called about every 100 ms while work is in progress (for progress reports).
  void run(const std::function<void()>& tick);
  void cancel() { cancelled_ = true; }

  uint64_t bytesDone() const { return bytesDone_.load(); }
  uint64_t bytesTotal() const { return bytesTotal_; }
  Phase phase() const { return static_cast<Phase>(phase_.load()); }
  std::vector<RegionTask>& tasks() { return tasks_; }

  // Per GPU the job wrote to (hydrate, copy): the bytes, and the seconds from the start of the
  // copying pass until its last copy had landed (copy: exact per device, each worker's stream
  // of that device drained; hydrate: when the last worker holding that device's chunks finished).
  struct DeviceStat {
    uint64_t bytes = 0;
    double seconds = 0;
  };
  std::map<int, DeviceStat> deviceStats() const;

 private:
  struct Chunk {
    uint32_t task;
    uint32_t index;
    uint64_t offset;
    uint64_t length;
  };
  struct TaskState;

  void validate();
  void interleaveDevices();
  bool needsStaging(Operation op) const;
  void runPass(Operation op, uint32_t workers, const std::function<void()>& tick);
  void hydrateWorker(Operation op, void* slots[2]);
  void captureWorker(void* slots[2]);
  void bulkWorker(bool intoHost);
  void finishChunk(const Chunk& c);
  void fail(const NativeError& error);
  bool stopping() const { return cancelled_.load() || failed_.load(); }

  JobOptions options_;
  std::vector<RegionTask> tasks_;
  std::vector<std::unique_ptr<TaskState>> state_;
  std::shared_ptr<StagingPool> pool_;
  std::vector<Chunk> chunks_;
  std::atomic<size_t> cursor_{0};
  std::atomic<uint64_t> bytesDone_{0};
  uint64_t bytesTotal_ = 0;
  std::atomic<int> phase_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> failed_{false};
  std::mutex errorMutex_;
  std::optional<NativeError> error_;
  std::chrono::steady_clock::time_point passStart_;
  mutable std::mutex statsMutex_;
  std::map<int, DeviceStat> stats_;
  void noteDevice(int device, uint64_t bytes);
};

}  // namespace vsnap::transfer
