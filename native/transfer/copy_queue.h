// CopyQueue: RAM-tier bytes copied into regions in the order they are pushed, batch after batch,
// on one stream per GPU, so the copy engine is never idle between batches. A restore pushes its
// regions as they become ready (the first ones made, then the rest, then those the engine's wake
// writes into) and learns when each batch has landed (to digest it while later ones copy). One
// transfer job per batch drained its streams and started its threads again every time.
//
// Two threads: the issuer opens each batch's regions and issues its copies (asynchronous on a
// GPU, a memcpy for host memory), recording an event per GPU every kMarkBytes and at the batch's
// end; the waiter waits for those marks in order, counts the bytes landed and settles a batch once
// its last mark completed, releasing its regions only then (never while a copy into them may be
// in flight). A failure (a region that cannot be opened, a copy the driver refuses) settles that
// batch and every later one with the same error; cancel() stops issuing at the next chunk and
// settles what is left as E_ABORTED, each batch only after what was issued for it landed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transfer/region.h"

namespace vsnap::cuda {
class Event;
}

namespace vsnap::transfer {

// One region of a batch: its bytes come from `source` (host memory: a RAM-tier buffer slice) and
// land in `target`. Both are opened on the issuer thread (opening may map device memory).
struct CopyItem {
  std::string name;  // named in errors
  uint64_t size = 0;
  std::function<std::unique_ptr<Region>()> target;
  std::function<std::unique_ptr<Region>()> source;
};

// How a batch ended, given to the settle callback on the waiter thread.
struct BatchOutcome {
  uint64_t id = 0;
  uint64_t bytes = 0;
  double issuedAt = 0;  // seconds since the queue opened: its first copy issued (-1: none)
  double landedAt = 0;  // seconds since the queue opened: its last byte landed, or it failed
  std::map<int, uint64_t> deviceBytes;  // per GPU written to
  uint64_t copies = 0;  // copies issued (regions side by side in one span share them)
  std::optional<NativeError> error;
};

class CopyQueue {
 public:
  using Settled = std::function<void(const BatchOutcome&)>;
  using Progress = std::function<void(uint64_t landed)>;

  // chunkSize: the largest single copy (cancellation and progress granularity).
  CopyQueue(std::string label, uint64_t chunkSize, Settled settled, Progress progress);
  ~CopyQueue();  // cancels, then waits for both threads
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  // Queues a batch; returns its id (1, 2, ...). Throws E_INVALID_ARGUMENT once closed.
  uint64_t push(std::vector<CopyItem> items);
  // No more batches: the threads end once every batch has settled.
  void close();
  // Stops issuing at the next chunk; every batch not landed settles as E_ABORTED.
  void cancel();
  // Waits until both threads have ended (after close() or cancel()).
  void join();

  uint64_t bytesLanded() const { return landed_.load(); }

 private:
  struct Batch {
    uint64_t id;
    std::vector<CopyItem> items;
  };
  // A point in the copies: when every event has completed, `bytes` more have landed; `last`
  // settles the batch (with `error` if set), releasing `regions`.
  struct Mark {
    std::vector<std::unique_ptr<cuda::Event>> events;
    uint64_t bytes = 0;
    bool last = false;
    std::shared_ptr<BatchOutcome> outcome;
    std::vector<std::unique_ptr<Region>> regions;
  };

  void issuer();
  void waiter();
  void issueBatch(Batch& batch);
  void pushMark(Mark mark);
  double now() const;
  bool stopping() const { return cancelled_.load() || failed_.load(); }

  std::string label_;
  uint64_t chunkSize_;
  Settled settled_;
  Progress progress_;
  std::chrono::steady_clock::time_point opened_;

  std::mutex mutex_;
  std::condition_variable batchesCv_;
  std::deque<Batch> batches_;
  uint64_t nextId_ = 1;
  bool closed_ = false;
  bool issuerDone_ = false;

  std::mutex marksMutex_;
  std::condition_variable marksCv_;
  std::deque<Mark> marks_;

  std::atomic<bool> cancelled_{false};
  std::atomic<bool> failed_{false};
  std::optional<NativeError> error_;  // the first failure (issuer thread writes, before failed_)
  std::atomic<uint64_t> landed_{0};
  Lane lane_;  // issuer thread only: one stream per GPU
  std::thread issuer_;
  std::thread waiter_;
  std::once_flag joined_;
};

}  // namespace vsnap::transfer
