#include "transfer/multipath.h"

#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

#include "transfer/region.h"

namespace vsnap::transfer {

MultipathJob::MultipathJob(std::string label, std::vector<uint64_t> taskSizes, uint64_t chunkSize,
                           std::shared_ptr<MultipathBackend> backend)
    : label_(std::move(label)), chunkSize_(chunkSize), backend_(std::move(backend)) {
  if (chunkSize_ == 0) throwInvalid("multipath chunk size must be > 0");
  for (uint32_t t = 0; t < taskSizes.size(); t++) {
    for (uint64_t off = 0; off < taskSizes[t]; off += chunkSize_) {
      queue_.push_back({t, off, std::min(chunkSize_, taskSizes[t] - off)});
    }
    bytesTotal_ += taskSizes[t];
  }
}

MultipathJob::~MultipathJob() = default;

void MultipathJob::cancel() {
  cancelled_ = true;
  changed_.notify_all();
}

void MultipathJob::cancelRelay() {
  relayCancel_ = true;
  changed_.notify_all();
}

MultipathStats MultipathJob::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void MultipathJob::fail(const NativeError& e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = e;
    failed_ = true;
  }
  changed_.notify_all();
}

// The next chunk for a path, or none: the job is stopping, the relay path was cancelled, or the
// queue is empty and (for the direct path) the relay path can no longer give chunks back.
std::optional<MultipathChunk> MultipathJob::take(End end, bool relay) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint32_t quota = schedule_.relayChunks;
  while (true) {
    if (stopping() || (relay && relayCancel_)) return std::nullopt;
    if (relay && quota > 0 && relayTaken_ >= quota) return std::nullopt;
    // the test schedule: the direct path waits while the relay path takes its chunks
    bool held = !relay && relayActive_ && !queue_.empty() &&
                ((quota > 0 && relayTaken_ < quota) || (schedule_.holdRelay && !relayHolding_));
    if (!held && !queue_.empty()) {
      MultipathChunk c = end == End::Front ? queue_.front() : queue_.back();
      if (end == End::Front) queue_.pop_front(); else queue_.pop_back();
      if (relay) relayTaken_++;
      if (quota > 0 || schedule_.holdRelay) changed_.notify_all();  // a held path may go on
      return c;
    }
    if (!held && (relay || !relayActive_)) return std::nullopt;
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

// The test schedule's holdRelay, before the relay path waits for a copy (its ring is full): the
// direct path may start, and the copy waits until the direct path has taken every other chunk,
// the relay path is released, or the job stops.
void MultipathJob::holdRelay() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!relayHolding_) {
    relayHolding_ = true;
    changed_.notify_all();
  }
  while (!queue_.empty() && !stopping() && !relayCancel_) changed_.wait_for(lock, std::chrono::milliseconds(50));
}

void MultipathJob::giveBack(const MultipathChunk& c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_front(c);
    stats_.requeued++;
  }
  changed_.notify_all();
}

double MultipathJob::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

// Called with the path's count after the change, under no lock; takes the lock for the stats.
void MultipathJob::issued(PathTimeline& t, uint32_t inFlight, double& busySince) {
  double at = now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (t.firstStart < 0) t.firstStart = at;
  if (inFlight == 1) busySince = at;
  t.maxInFlight = std::max(t.maxInFlight, inFlight);
}

void MultipathJob::retired(PathTimeline& t, uint32_t inFlight, double busySince) {
  double at = now();
  std::lock_guard<std::mutex> lock(mutex_);
  t.lastEnd = at;
  if (inFlight == 0) t.busySeconds += at - busySince;
}

// Keeps every slot busy: slots are filled in turn, and a slot is waited for (its copy is the
// oldest in flight) only when the worker comes back to it, so up to directSlots copies stay
// queued on the backend's streams; no lock is held while waiting.
void MultipathJob::directWorker() {
  MultipathBackend& b = *backend_;
  const uint32_t n = std::max<uint32_t>(1, b.directSlots());
  std::vector<std::optional<MultipathChunk>> inFlight(n);
  uint32_t count = 0;
  double busySince = 0;
  auto complete = [&](const MultipathChunk& c) {
    bytesDone_ += c.length;
    count--;
    retired(stats_.direct, count, busySince);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytesDirect += c.length;
    stats_.chunksDirect++;
  };
  try {
    for (uint32_t s = 0;; s = (s + 1) % n) {
      if (inFlight[s]) {
        b.directWait(s);
        complete(*inFlight[s]);
        inFlight[s].reset();
      }
      std::optional<MultipathChunk> c = take(End::Front, false);
      if (!c) break;
      inFlight[s] = c;
      b.directCopy(s, *c);
      issued(stats_.direct, ++count, busySince);
    }
    for (uint32_t s = 0; s < n; s++) {
      if (!inFlight[s]) continue;
      b.directWait(s);
      complete(*inFlight[s]);
      inFlight[s].reset();
    }
  } catch (const NativeError& e) {
    fail(e);
  } catch (const std::exception& e) {
    fail(NativeError("E_INTERNAL", std::string("multipath direct worker failed: ") + e.what()));
  }
  // Never leave a copy in flight: the target may be unmapped right after.
  for (uint32_t s = 0; s < n; s++) {
    if (!inFlight[s]) continue;
    try { b.directWait(s); } catch (...) {}
  }
}

void MultipathJob::relayWorker() {
  MultipathBackend& b = *backend_;
  const uint32_t n = b.relaySlots();
  std::vector<std::optional<MultipathChunk>> inFlight(n);
  uint32_t count = 0;
  double busySince = 0;
  std::string why;
  auto complete = [&](const MultipathChunk& c) {
    bytesDone_ += c.length;
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytesRelay += c.length;
    stats_.chunksRelay++;
  };
  try {
    for (uint32_t s = 0;; s = (s + 1) % n) {
      if (inFlight[s]) {
        MultipathChunk c = *inFlight[s];
        inFlight[s].reset();
        count--;
        if (schedule_.holdRelay) holdRelay();
        try {
          b.relayWait(s);  // back-pressure: the slot is free only once its peer copy is done
        } catch (...) {
          retired(stats_.relay, count, busySince);
          giveBack(c);
          throw;
        }
        retired(stats_.relay, count, busySince);
        complete(c);
      }
      std::optional<MultipathChunk> c = take(End::Back, true);
      if (!c) break;
      try {
        b.relayCopy(s, *c);
      } catch (...) {
        giveBack(*c);  // the backend waited for what it had issued of it
        throw;
      }
      inFlight[s] = c;
      issued(stats_.relay, ++count, busySince);
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.maxRelayInFlight = std::max(stats_.maxRelayInFlight, count);
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  // Drain: chunks whose copy completed count; the others go back to the direct path. Every
  // relay copy is over before any chunk is given back, so a late peer copy cannot overwrite
  // what the direct path writes again.
  for (uint32_t s = 0; s < n; s++) {
    if (!inFlight[s]) continue;
    count--;
    try {
      b.relayWait(s);
      retired(stats_.relay, count, busySince);
      complete(*inFlight[s]);
    } catch (const std::exception& e) {
      retired(stats_.relay, count, busySince);
      if (why.empty()) why = e.what();
      giveBack(*inFlight[s]);
    }
    inFlight[s].reset();
  }
  try {
    b.releaseRelay();
  } catch (const std::exception& e) {
    if (why.empty()) why = std::string("releasing the neighbour ring failed: ") + e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    relayActive_ = false;
    stats_.relayCancelled = relayCancel_.load();
    stats_.relayError = why;
  }
  changed_.notify_all();
}

void MultipathJob::run(const std::function<void()>& tick) {
  started_ = std::chrono::steady_clock::now();
  bool relay = backend_->relaySlots() > 0 && !queue_.empty();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    relayActive_ = relay;
    stats_.relayUsed = relay;
    if (!relay) {
      stats_.relayCancelled = relayCancel_.load();
      stats_.relayError = stats_.relayCancelled ? "the neighbour was released before the restore started" : backend_->relayNote();
    }
  }
  std::mutex doneMutex;
  std::condition_variable doneCv;
  int running = 0;
  auto start = [&](void (MultipathJob::*worker)()) -> std::thread {
    {
      std::lock_guard<std::mutex> lock(doneMutex);
      running++;
    }
    try {
      return std::thread([&, worker] {
        (this->*worker)();
        std::lock_guard<std::mutex> lock(doneMutex);
        running--;
        doneCv.notify_all();
      });
    } catch (...) {
      std::lock_guard<std::mutex> lock(doneMutex);
      running--;
      throw;
    }
  };
  std::thread relayThread;
  if (relay) {
    try {
      relayThread = start(&MultipathJob::relayWorker);
    } catch (const std::system_error& e) {  // no relay thread: the direct path does it all
      std::lock_guard<std::mutex> lock(mutex_);
      relayActive_ = false;
      stats_.relayUsed = false;
      stats_.relayError = std::string("could not start the relay thread: ") + e.what();
      backend_->releaseRelay();
    }
  }
  std::thread directThread;
  try {
    directThread = start(&MultipathJob::directWorker);
  } catch (const std::system_error& e) {
    cancel();
    if (relayThread.joinable()) relayThread.join();
    throw NativeError("E_INTERNAL", std::string("could not start a transfer thread (") + e.what() +
                                        "): the process is at its thread limit (ulimit -u, the cgroup's pids.max)");
  }
  try {
    std::unique_lock<std::mutex> lock(doneMutex);
    while (running > 0) {
      doneCv.wait_for(lock, std::chrono::milliseconds(100));
      lock.unlock();
      tick();
      lock.lock();
    }
  } catch (...) {
    cancel();
    directThread.join();
    if (relayThread.joinable()) relayThread.join();
    throw;
  }
  directThread.join();
  if (relayThread.joinable()) relayThread.join();
  if (error_) throw *error_;
  if (cancelled_) throw NativeError("E_ABORTED", "the multi-path restore of '" + label_ + "' was cancelled");
  if (bytesDone_.load() != bytesTotal_) {
    throw NativeError("E_INTERNAL", "multi-path restore of '" + label_ + "' ended with " + std::to_string(bytesDone_.load()) +
                                        " of " + std::to_string(bytesTotal_) + " bytes confirmed; it is not complete");
  }
}

// ---- host-memory backend (tests) ----

class HostMultipathBackend final : public MultipathBackend {
 public:
  HostMultipathBackend(std::vector<std::unique_ptr<Region>> targets, std::vector<const char*> sources, uint32_t directSlots,
                       uint32_t relaySlots, uint64_t slotSize, HostBackendFaults faults)
      : targets_(std::move(targets)), sources_(std::move(sources)), direct_(directSlots), relay_(relaySlots),
        slotSize_(slotSize), faults_(faults), ring_(static_cast<size_t>(relaySlots) * slotSize) {
    ringBytes_ = ring_.size();
  }
  uint32_t directSlots() const override { return static_cast<uint32_t>(direct_.size()); }
  uint32_t relaySlots() const override { return static_cast<uint32_t>(relay_.size()); }
  std::string relayNote() const override { return relay_.empty() ? "no relay slots" : ""; }
  uint64_t ringBytes() const override { return ringBytes_.load(); }

  void directCopy(uint32_t slot, const MultipathChunk& c) override {
    Pending& p = direct_.at(slot);
    if (p.busy) throw NativeError("E_INTERNAL", "direct slot " + std::to_string(slot) + " reused while its copy is in flight");
    p = {true, c, ++directSeq_};
  }
  void directWait(uint32_t slot) override {
    Pending& p = direct_.at(slot);
    if (!p.busy) return;
    p.busy = false;
    if (faults_.directDelayMs) std::this_thread::sleep_for(std::chrono::milliseconds(faults_.directDelayMs));
    if (p.seq == faults_.failDirectAt) throw NativeError("E_CUDA", "injected fault: direct copy " + std::to_string(p.seq) + " failed");
    write(p.chunk, sources_.at(p.chunk.task) + p.chunk.offset, directLane_);
  }
  void relayCopy(uint32_t slot, const MultipathChunk& c) override {
    Pending& p = relay_.at(slot);
    if (released_) throw NativeError("E_INTERNAL", "relay copy after the ring was released");
    if (p.busy) throw NativeError("E_INTERNAL", "ring slot " + std::to_string(slot) + " reused before its peer copy completed");
    if (c.length > slotSize_) throw NativeError("E_INTERNAL", "chunk larger than a ring slot");
    std::memcpy(ring_.data() + slot * slotSize_, sources_.at(c.task) + c.offset, c.length);  // host -> neighbour
    p = {true, c, ++relaySeq_};
  }
  void relayWait(uint32_t slot) override {
    Pending& p = relay_.at(slot);
    if (!p.busy) return;
    p.busy = false;
    if (faults_.relayDelayMs) std::this_thread::sleep_for(std::chrono::milliseconds(faults_.relayDelayMs));
    if (p.seq == faults_.failRelayAt) {
      // A failed peer copy may have written part of the chunk: leave garbage there.
      std::vector<char> junk(std::min<uint64_t>(p.chunk.length, 4096), '\xee');
      MultipathChunk head{p.chunk.task, p.chunk.offset, junk.size()};
      write(head, junk.data(), relayLane_);
      throw NativeError("E_CUDA", "injected fault: peer copy " + std::to_string(p.seq) + " failed");
    }
    write(p.chunk, ring_.data() + slot * slotSize_, relayLane_);  // neighbour -> target
  }
  void releaseRelay() override {
    released_ = true;
    std::vector<char>().swap(ring_);
    ringBytes_ = 0;
  }

 private:
  struct Pending {
    bool busy = false;
    MultipathChunk chunk{};
    uint32_t seq = 0;
  };
  void write(const MultipathChunk& c, const char* src, Lane& lane) {
    Fence fence;
    targets_.at(c.task)->copyIn(c.offset, src, c.length, lane, 0, fence);
    fence.wait();
  }
  std::vector<std::unique_ptr<Region>> targets_;
  std::vector<const char*> sources_;
  std::vector<Pending> direct_;
  std::vector<Pending> relay_;
  uint64_t slotSize_;
  HostBackendFaults faults_;
  std::vector<char> ring_;
  std::atomic<uint64_t> ringBytes_{0};
  bool released_ = false;
  uint32_t directSeq_ = 0;
  uint32_t relaySeq_ = 0;
  Lane directLane_;
  Lane relayLane_;
};

std::shared_ptr<HostMultipathBackend> hostMultipathBackend(std::vector<std::unique_ptr<Region>> targets, std::vector<const char*> sources,
                                                           uint32_t directSlots, uint32_t relaySlots, uint64_t slotSize,
                                                           HostBackendFaults faults) {
  return std::make_shared<HostMultipathBackend>(std::move(targets), std::move(sources), directSlots, relaySlots, slotSize, faults);
}

std::shared_ptr<MultipathBackend> asBackend(std::shared_ptr<HostMultipathBackend> backend) { return backend; }

}  // namespace vsnap::transfer
