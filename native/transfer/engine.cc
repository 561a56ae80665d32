#include "transfer/engine.h"

#include <algorithm>
#include <map>
#include <chrono>
#include <condition_variable>
#include <system_error>
#include <thread>

#include "common/fault.h"
#include "io/files.h"

namespace vsnap::transfer {
namespace {

// Hashing follows reading in steps of this size, so the bytes are still in cache.
constexpr uint64_t kHashStep = 4ull << 20;

uint32_t defaultThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return std::clamp<unsigned>(n == 0 ? 4 : n, 1, 16);
}

std::string range(uint64_t offset, uint64_t length) {
  return std::to_string(offset) + ".." + std::to_string(offset + length - 1);
}

// The "chunk-delay" test fault: a transfer that is reliably still running when a test acts.
void delayForTests() {
  if (fault::hit(fault::Point::ChunkDelay)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(fault::arg(fault::Point::ChunkDelay)));
  }
}

}  // namespace

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::Starting: return "starting";
    case Phase::Verifying: return "verifying";
    case Phase::Copying: return "copying";
    case Phase::Flushing: return "flushing";
    case Phase::Done: return "done";
  }
  return "unknown";
}

// Per-task I/O, opened by the first worker that needs it and closed by the one that finishes
// the task's last chunk, so open descriptors stay bounded by the worker count.
struct TransferJob::TaskState {
  std::once_flag opened;
  std::unique_ptr<io::BlobReader> reader;
  std::unique_ptr<io::BlobWriter> writer;
  std::atomic<uint32_t> remaining{0};
};

TransferJob::TransferJob(JobOptions options, std::vector<RegionTask> tasks, std::shared_ptr<StagingPool> pool)
    : options_(std::move(options)), tasks_(std::move(tasks)), pool_(std::move(pool)) {}

TransferJob::~TransferJob() = default;

void TransferJob::validate() {
  for (size_t t = 0; t < tasks_.size(); t++) {
    RegionTask& task = tasks_[t];
    if (task.chunkSize == 0 || task.chunkSize % io::kDirectAlignment != 0) {
      throwInvalid("region '" + task.name + "': chunk size must be a positive multiple of 4096");
    }
    if (pool_ && task.chunkSize > pool_->slotSize()) {
      throwInvalid("region '" + task.name + "': chunk size " + std::to_string(task.chunkSize) +
                   " exceeds the staging slot size " + std::to_string(pool_->slotSize()) +
                   "; use a staging pool with larger slots");
    }
    bool needsHostCopy = options_.op == Operation::Copy || (options_.op == Operation::Capture && task.blobPath.empty());
    if ((needsHostCopy || task.hostCopy) && (!task.hostCopy || !task.hostCopy->hostData() || task.hostCopy->size() < task.size)) {
      throwInvalid("region '" + task.name + "' needs a host buffer copy of at least " + std::to_string(task.size) + " bytes");
    }
    if (options_.op != Operation::Verify) {
      if (!task.region) throwInvalid("region '" + task.name + "' has no memory to copy to or from");
      if (task.region->size() < task.size) {
        throwInvalid("region '" + task.name + "' is " + std::to_string(task.region->size()) +
                     " bytes, smaller than the " + std::to_string(task.size) + " bytes to transfer");
      }
    }
    uint64_t count = (task.size + task.chunkSize - 1) / task.chunkSize;
    if (options_.digestChunks && (options_.op != Operation::Capture || !options_.hashChunks)) {
      throwInvalid("chunk digests come with a hashed capture only");
    }
    if (options_.op == Operation::Capture && !options_.hashChunks && (!task.blobPath.empty() || !task.hostCopy)) {
      throwInvalid("region '" + task.name + "': a capture without hashing lands in a host buffer copy only (no blob file)");
    }
    if (options_.op == Operation::Capture) {
      if (options_.hashChunks) task.checksums.assign(count, hash::Digest{});
      if (options_.digestChunks) task.digests.assign(count, digest::Hash128{});
    } else if (options_.op != Operation::Copy && task.expected.size() != count) {
      throwInvalid("region '" + task.name + "' has " + std::to_string(task.expected.size()) +
                   " checksums; " + std::to_string(task.size) + " bytes in chunks of " +
                   std::to_string(task.chunkSize) + " need " + std::to_string(count));
    }
    auto state = std::make_unique<TaskState>();
    state->remaining = static_cast<uint32_t>(count);
    state_.push_back(std::move(state));
    for (uint64_t i = 0; i < count; i++) {
      uint64_t offset = i * task.chunkSize;
      chunks_.push_back({static_cast<uint32_t>(t), static_cast<uint32_t>(i), offset,
                         std::min(task.chunkSize, task.size - offset)});
    }
    bytesTotal_ += task.size;
  }
  bool verifyPass = options_.op == Operation::Hydrate && options_.verifyFirst;
  if (!pool_ && (needsStaging(options_.op) || verifyPass)) throwInvalid("a transfer needs a staging pool");
  interleaveDevices();
}

// Whether a pass moves any chunk through a staging slot. It does not when every region's bytes
// are RAM-tier memory on one side: a copy from the RAM tier, a capture into (or out of) it, a
// load into it. Such a pass needs no staging pool at all.
bool TransferJob::needsStaging(Operation op) const {
  for (const RegionTask& task : tasks_) {
    switch (op) {
      case Operation::Copy: return false;
      case Operation::Verify: return true;
      case Operation::Capture:
        if (!task.hostCopy && !task.region->hostData()) return true;
        break;
      case Operation::Hydrate:
        if (!task.region->hostMemory()) return true;
        break;
    }
  }
  return false;
}

// Chunks are taken in order; with regions on several GPUs, alternate between the devices so
// every device's link is busy at once instead of one GPU after the other.
void TransferJob::interleaveDevices() {
  std::map<int, std::vector<Chunk>> byDevice;
  for (const Chunk& c : chunks_) {
    const Region* r = tasks_[c.task].region.get();
    byDevice[r ? r->device() : -1].push_back(c);
  }
  if (byDevice.size() < 2) return;
  std::vector<Chunk> merged;
  merged.reserve(chunks_.size());
  for (size_t i = 0; merged.size() < chunks_.size(); i++) {
    for (auto& [device, list] : byDevice) {
      if (i < list.size()) merged.push_back(list[i]);
    }
  }
  chunks_ = std::move(merged);
}

std::map<int, TransferJob::DeviceStat> TransferJob::deviceStats() const {
  std::lock_guard<std::mutex> lock(statsMutex_);
  return stats_;
}

// A worker's bytes for a device, and the time its copies to that device had all landed.
void TransferJob::noteDevice(int device, uint64_t bytes) {
  double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - passStart_).count();
  std::lock_guard<std::mutex> lock(statsMutex_);
  DeviceStat& d = stats_[device];
  d.bytes += bytes;
  d.seconds = std::max(d.seconds, at);
}

void TransferJob::fail(const NativeError& error) {
  std::lock_guard<std::mutex> lock(errorMutex_);
  if (!error_) error_ = error;
  failed_ = true;
}

void TransferJob::run(const std::function<void()>& tick) {
  validate();
  if (options_.op == Operation::Hydrate || options_.op == Operation::Verify) {
    // Every blob must exist and have its full size before anything is copied anywhere.
    for (auto& task : tasks_) {
      io::BlobReader probe(task.blobPath, task.size, false);
      (void)probe;
    }
  }
  uint32_t threads = options_.threads ? options_.threads : defaultThreads();
  uint32_t workers = static_cast<uint32_t>(std::min<size_t>(threads, std::max<size_t>(chunks_.size(), 1)));
  if (options_.op == Operation::Hydrate && options_.verifyFirst) {
    phase_ = static_cast<int>(Phase::Verifying);
    runPass(Operation::Verify, workers, tick);
    for (auto& s : state_) s->reader.reset();
    for (size_t t = 0; t < tasks_.size(); t++) {
      state_[t] = std::make_unique<TaskState>();
      state_[t]->remaining = static_cast<uint32_t>((tasks_[t].size + tasks_[t].chunkSize - 1) / tasks_[t].chunkSize);
    }
    cursor_ = 0;
    bytesDone_ = 0;
  }
  phase_ = static_cast<int>(Phase::Copying);
  runPass(options_.op, workers, tick);
  phase_ = static_cast<int>(Phase::Done);
  tick();
}

void TransferJob::runPass(Operation op, uint32_t workers, const std::function<void()>& tick) {
  if (op == Operation::Capture) {
    // Zero-length regions have no chunks but still get their (empty) blob file.
    for (auto& task : tasks_) {
      if (task.size == 0 && !task.blobPath.empty()) io::BlobWriter(task.blobPath, 0).finish();
    }
  }
  if (chunks_.empty()) return;
  passStart_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(statsMutex_);
    stats_.clear();
  }
  std::vector<void*> slots;
  if (needsStaging(op)) {
    slots = pool_->acquire(2, workers * 2, [this] { return stopping(); });
    if (slots.empty()) throw NativeError("E_ABORTED", "the transfer was cancelled");
    workers = static_cast<uint32_t>(slots.size() / 2);
  }

  // Every started worker is joined and every slot returned on every path out of here: a
  // thread that cannot be started (EAGAIN under a pids or ulimit cap) must not leave joinable
  // threads behind (std::terminate) or slots borrowed from the shared pool.
  std::mutex doneMutex;
  std::condition_variable doneCv;
  uint32_t running = 0;
  std::vector<std::thread> threads;
  threads.reserve(workers);  // emplace_back below then only throws from the thread's start
  auto joinAll = [&] {
    for (auto& t : threads) t.join();
    threads.clear();
    if (!slots.empty()) pool_->release(slots);
    slots.clear();
  };
  std::string startError;
  for (uint32_t w = 0; w < workers; w++) {
    {
      std::lock_guard<std::mutex> lock(doneMutex);
      running++;
    }
    try {
      if (fault::hit(fault::Point::ThreadStart)) {
        throw std::system_error(EAGAIN, std::generic_category(), "injected fault");
      }
      threads.emplace_back([&, w] {
        void* mine[2] = {nullptr, nullptr};
        if (!slots.empty()) {
          mine[0] = slots[2 * w];
          mine[1] = slots[2 * w + 1];
        }
        try {
          if (op == Operation::Capture && !options_.hashChunks) {
            bulkWorker(true);
          } else if (op == Operation::Capture) {
            captureWorker(mine);
          } else if (op == Operation::Copy) {
            bulkWorker(false);
          } else {
            hydrateWorker(op, mine);
          }
        } catch (const NativeError& e) {
          fail(e);
        } catch (const std::exception& e) {
          fail(NativeError("E_INTERNAL", std::string("transfer worker failed: ") + e.what()));
        }
        std::lock_guard<std::mutex> lock(doneMutex);
        running--;
        doneCv.notify_all();
      });
    } catch (const std::system_error& e) {
      std::lock_guard<std::mutex> lock(doneMutex);
      running--;
      startError = e.what();
      break;  // carry on with the workers that did start: they share the chunks
    }
  }
  if (threads.empty()) {
    joinAll();
    throw NativeError("E_INTERNAL", "could not start a transfer thread (" + startError +
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
    cancel();  // stop the workers, wait for them, give the slots back, then report the failure
    joinAll();
    throw;
  }
  joinAll();
  if (error_) throw *error_;
  if (cancelled_) throw NativeError("E_ABORTED", "the transfer was cancelled");
}

void TransferJob::finishChunk(const Chunk& c) {
  TaskState& s = *state_[c.task];
  if (s.remaining.fetch_sub(1) == 1) {
    if (s.writer) {
      s.writer->finish();
      s.writer.reset();
    }
    s.reader.reset();
  }
}

void TransferJob::hydrateWorker(Operation op, void* slots[2]) {
  Lane lane;
  Fence fences[2];
  hash::Hasher hasher;
  struct Drain {  // never leave a copy in flight: the region may be unmapped right after
    Fence* f;
    ~Drain() {
      for (int i = 0; i < 2; i++) {
        try { f[i].wait(); } catch (...) {}
      }
    }
  } drain{fences};
  int s = 0;
  std::map<int, uint64_t> perDevice;  // bytes this worker wrote to each GPU
  while (!stopping()) {
    size_t i = cursor_.fetch_add(1);
    if (i >= chunks_.size()) break;
    delayForTests();
    const Chunk& c = chunks_[i];
    RegionTask& task = tasks_[c.task];
    TaskState& st = *state_[c.task];
    std::call_once(st.opened, [&] { st.reader = std::make_unique<io::BlobReader>(task.blobPath, task.size, options_.directIo); });
    // A RAM-tier target is read into directly (a bad chunk there only discards the cache entry);
    // anything else goes through staging, so a bad chunk never reaches it.
    char* direct = op == Operation::Hydrate ? task.region->hostMemory() : nullptr;
    if (!direct) fences[s].wait();
    char* buf = direct ? direct + c.offset : static_cast<char*>(slots[s]);
    hasher.reset();
    for (uint64_t done = 0; done < c.length;) {
      uint64_t step = std::min(kHashStep, c.length - done);
      st.reader->read(c.offset + done, buf + done, step);
      hasher.update(buf + done, step);
      done += step;
    }
    hash::Digest actual = hasher.finish();
    const hash::Digest& expected = task.expected[c.index];
    if (actual != expected) {
      uint64_t count = task.expected.size();
      throw NativeError(
          "E_CHECKSUM",
          "checksum mismatch in snapshot '" + options_.label + "', region '" + task.name + "', chunk " +
              std::to_string(c.index) + " of " + std::to_string(count) + " (bytes " + range(c.offset, c.length) +
              " of " + task.blobPath + "): expected " + expected.hex() + ", found " + actual.hex() +
              ". The blob is corrupt; nothing from this chunk was copied. Run `vsnap verify` and recapture the snapshot.",
          {{"snapshot", options_.label}, {"region", task.name}, {"chunk", static_cast<int64_t>(c.index)},
           {"chunks", static_cast<int64_t>(count)}, {"offset", static_cast<int64_t>(c.offset)},
           {"length", static_cast<int64_t>(c.length)}, {"expected", expected.hex()}, {"actual", actual.hex()},
           {"path", task.blobPath}});
    }
    if (op == Operation::Hydrate && !direct) {
      task.region->copyIn(c.offset, buf, c.length, lane, s, fences[s]);
      s ^= 1;
      if (task.region->device() >= 0) perDevice[task.region->device()] += c.length;
    }
    bytesDone_ += c.length;
    finishChunk(c);
  }
  fences[0].wait();
  fences[1].wait();
  for (auto& [device, bytes] : perDevice) noteDevice(device, bytes);
}

void TransferJob::captureWorker(void* slots[2]) {
  hash::Hasher hasher;
  digest::ChunkDigester digester;
  // Both checksums of a chunk from one read: piece by piece, each piece still in cache when
  // the second one reads it.
  auto hashChunk = [&](const char* data, const Chunk& c, RegionTask& task) {
    if (!options_.digestChunks) {
      task.checksums[c.index] = hash::digest(data, c.length);
      return;
    }
    constexpr uint64_t kPiece = 256 << 10;
    hasher.reset();
    digester.reset();
    for (uint64_t at = 0; at < c.length; at += kPiece) {
      uint64_t n = std::min(kPiece, c.length - at);
      hasher.update(data + at, n);
      digester.update(reinterpret_cast<const unsigned char*>(data) + at, n);
    }
    task.checksums[c.index] = hasher.finish();
    task.digests[c.index] = digester.finish();
  };
  Lane lane;
  Fence fences[2];
  struct Drain {
    Fence* f;
    ~Drain() {
      for (int i = 0; i < 2; i++) {
        try { f[i].wait(); } catch (...) {}
      }
    }
  } drain{fences};
  // The copy of the next chunk runs while this worker hashes and writes the previous one.
  // A chunk lands in the RAM-tier copy when there is one (no staging), else in a staging slot;
  // a region that is itself RAM-tier memory is hashed and written where it is, with no copy.
  std::optional<size_t> inFlight;
  const char* inFlightData = nullptr;
  int cur = 0;  // the slot the next copy goes to; the in-flight chunk is in cur ^ 1
  while (true) {
    std::optional<size_t> next;
    const char* nextData = nullptr;
    if (!stopping()) {
      size_t i = cursor_.fetch_add(1);
      if (i < chunks_.size()) next = i;
    }
    if (next) delayForTests();
    if (next) {
      const Chunk& c = chunks_[*next];
      RegionTask& task = tasks_[c.task];
      TaskState& st = *state_[c.task];
      if (!task.blobPath.empty()) {
        std::call_once(st.opened, [&] { st.writer = std::make_unique<io::BlobWriter>(task.blobPath, task.size); });
      }
      if (const char* inPlace = task.region->hostData()) {
        nextData = inPlace + c.offset;
      } else {
        char* landing = task.hostCopy ? task.hostCopy->hostMemory() + c.offset : static_cast<char*>(slots[cur]);
        task.region->copyOut(c.offset, landing, c.length, lane, cur, fences[cur]);
        nextData = landing;
      }
    }
    if (inFlight) {
      int slot = cur ^ 1;
      const Chunk& c = chunks_[*inFlight];
      RegionTask& task = tasks_[c.task];
      fences[slot].wait();
      hashChunk(inFlightData, c, task);
      if (auto& writer = state_[c.task]->writer) writer->write(c.offset, inFlightData, c.length);
      bytesDone_ += c.length;
      finishChunk(c);
    }
    if (!next) break;
    inFlight = next;
    inFlightData = nextData;
    cur ^= 1;
  }
}

// Issues every chunk's copy asynchronously on this worker's stream of the region's device and
// waits once at the end, so every GPU's copies go over its own link, all GPUs at once (chunks
// are interleaved). No staging, no hashing. Two directions:
//  - Copy (intoHost false): verified bytes from the RAM tier, straight from the (pinned) source;
//  - a capture with its hash deferred (intoHost true): into the RAM-tier copy. Nothing reads the
//    bytes here: the GPU digest taken at capture checks them after every restore and when they
//    are persisted.
void TransferJob::bulkWorker(bool intoHost) {
  Lane lane;
  Fence fence;
  struct Sync {
    Lane& lane;
    ~Sync() {
      try { lane.synchronize(); } catch (...) {}
    }
  } sync{lane};
  std::map<int, uint64_t> perDevice;  // bytes this worker issued to or from each GPU
  while (!stopping()) {
    size_t i = cursor_.fetch_add(1);
    if (i >= chunks_.size()) break;
    if (intoHost) delayForTests();
    const Chunk& c = chunks_[i];
    RegionTask& task = tasks_[c.task];
    if (intoHost) {
      task.region->copyOut(c.offset, task.hostCopy->hostMemory() + c.offset, c.length, lane, 0, fence);
    } else {
      task.region->copyIn(c.offset, task.hostCopy->hostData() + c.offset, c.length, lane, 0, fence);
    }
    if (task.region->device() >= 0) perDevice[task.region->device()] += c.length;
    bytesDone_ += c.length;
  }
  lane.synchronize([&](int device) { noteDevice(device, perDevice[device]); });
}

}  // namespace vsnap::transfer
