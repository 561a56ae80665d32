#include "transfer/copy_queue.h"

#include <algorithm>
#include <cstring>
#include <system_error>

#include "common/fault.h"
#include "cuda/context.h"
#include "cuda/stream.h"
#include "cuda/vmm.h"

namespace vsnap::transfer {
namespace {

// Progress is counted (an event recorded on each GPU the batch writes to) every this many bytes.
constexpr uint64_t kMarkBytes = 256ull << 20;
// How long the waiter sleeps between polls of an event it waits for (a blocking
// cuEventSynchronize may spin a core for the whole copy).
constexpr auto kPoll = std::chrono::microseconds(50);

NativeError aborted(const std::string& label) {
  return NativeError("E_ABORTED", "the copy of '" + label + "' was cancelled");
}

}  // namespace

CopyQueue::CopyQueue(std::string label, uint64_t chunkSize, Settled settled, Progress progress)
    : label_(std::move(label)),
      chunkSize_(chunkSize),
      settled_(std::move(settled)),
      progress_(std::move(progress)),
      opened_(std::chrono::steady_clock::now()) {
  if (chunkSize_ == 0) throwInvalid("a copy queue needs a chunk size above 0");
  try {
    if (fault::hit(fault::Point::ThreadStart)) throw std::system_error(EAGAIN, std::generic_category(), "injected fault");
    issuer_ = std::thread([this] { issuer(); });
    if (fault::hit(fault::Point::ThreadStart)) throw std::system_error(EAGAIN, std::generic_category(), "injected fault");
    waiter_ = std::thread([this] { waiter(); });
  } catch (const std::system_error& e) {
    cancel();
    if (issuer_.joinable()) issuer_.join();
    throw NativeError("E_INTERNAL", std::string("could not start a copy thread (") + e.what() +
                                        "): the process is at its thread limit (ulimit -u, the cgroup's pids.max)");
  }
}

CopyQueue::~CopyQueue() {
  cancel();
  join();
}

double CopyQueue::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_).count();
}

uint64_t CopyQueue::push(std::vector<CopyItem> items) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) throwInvalid("the copy queue of '" + label_ + "' is closed");
  uint64_t id = nextId_++;
  batches_.push_back(Batch{id, std::move(items)});
  batchesCv_.notify_all();
  return id;
}

void CopyQueue::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  batchesCv_.notify_all();
}

void CopyQueue::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  batchesCv_.notify_all();
}

void CopyQueue::join() {
  std::call_once(joined_, [this] {
    if (issuer_.joinable()) issuer_.join();
    if (waiter_.joinable()) waiter_.join();
  });
}

void CopyQueue::pushMark(Mark mark) {
  std::lock_guard<std::mutex> lock(marksMutex_);
  marks_.push_back(std::move(mark));
  marksCv_.notify_all();
}

void CopyQueue::issuer() {
  while (true) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // wait_for, not wait: condition_variable::wait needs GLIBCXX_3.4.30, past the prebuild's floor.
      while (batches_.empty() && !closed_) batchesCv_.wait_for(lock, std::chrono::milliseconds(100));
      if (batches_.empty()) break;
      batch = std::move(batches_.front());
      batches_.pop_front();
    }
    issueBatch(batch);
  }
  std::lock_guard<std::mutex> lock(marksMutex_);
  issuerDone_ = true;
  marksCv_.notify_all();
}

// Opens the batch's regions and issues its copies, chunk by chunk, marking progress; the last
// mark carries the regions (released once it landed) and any error.
void CopyQueue::issueBatch(Batch& batch) {
  auto outcome = std::make_shared<BatchOutcome>();
  outcome->id = batch.id;
  outcome->issuedAt = -1;
  std::vector<std::unique_ptr<Region>> regions;
  std::map<int, std::shared_ptr<cuda::Context>> devices;  // GPUs written to since the last mark
  uint64_t unmarked = 0;
  // Records an event on every GPU written to since the last mark.
  auto mark = [&](bool last) {
    Mark m;
    for (auto& [device, ctx] : devices) {
      auto event = std::make_unique<cuda::Event>(ctx);
      event->record(lane_.stream(ctx));
      m.events.push_back(std::move(event));
    }
    devices.clear();
    m.bytes = unmarked;
    unmarked = 0;
    m.last = last;
    if (last) {
      m.outcome = outcome;
      m.regions = std::move(regions);
    }
    pushMark(std::move(m));
  };
  // Copies whose source and target both continue the one before them, inside one span (a region
  // set's reservation) on one device, are joined into one copy of up to chunkSize bytes: 4,000
  // regions of 4 MiB mapped side by side take about 250 copies, not 4,000, and the driver calls
  // that issue them (each also contends for the context's lock the mapping needs) shrink with them.
  struct Run {
    const void* span = nullptr;
    std::shared_ptr<cuda::Context> ctx;  // device memory; null: host memory
    uint64_t target = 0;                 // device address, or host pointer
    const char* src = nullptr;
    uint64_t length = 0;
    std::string name;  // the region it starts in, for errors
  } run;
  auto issued = [&](uint64_t length, const std::shared_ptr<cuda::Context>& ctx) {
    if (ctx) {
      devices.emplace(ctx->ordinal(), ctx);
      outcome->deviceBytes[ctx->ordinal()] += length;
    }
    outcome->bytes += length;
    outcome->copies++;
    unmarked += length;
    if (unmarked >= kMarkBytes) mark(false);
  };
  // Fault points of one copy about to be issued.
  auto beforeCopy = [&](const std::string& name) {
    if (fault::hit(fault::Point::ChunkDelay)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(fault::arg(fault::Point::ChunkDelay)));
    }
    if (fault::hit(fault::Point::CopyFail)) {
      throw NativeError("E_CUDA", "injected fault: a copy of '" + label_ + "' failed (region '" + name + "')");
    }
    if (outcome->issuedAt < 0) outcome->issuedAt = now();
  };
  auto flush = [&] {
    if (run.length == 0) return;
    beforeCopy(run.name);
    if (run.ctx) {
      lane_.stream(run.ctx).copyToDevice(run.target, run.src, run.length);
    } else {
      std::memcpy(reinterpret_cast<char*>(run.target), run.src, run.length);
    }
    issued(run.length, run.ctx);
    run.length = 0;
  };
  try {
    for (CopyItem& item : batch.items) {
      if (stopping()) break;
      std::unique_ptr<Region> target = item.target();
      std::unique_ptr<Region> source = item.source();
      Region* t = target.get();
      const char* src = source->hostData();
      regions.push_back(std::move(target));
      regions.push_back(std::move(source));
      if (!src) throwInvalid("region '" + item.name + "': the copy's source is not host memory");
      if (t->size() < item.size) {
        throwInvalid("region '" + item.name + "' is " + std::to_string(t->size()) + " bytes, smaller than the " +
                     std::to_string(item.size) + " bytes to copy");
      }
      // Where the region is mapped, when it may join a run: device memory or host memory of a span.
      const void* span = item.size > 0 ? t->span() : nullptr;
      std::shared_ptr<cuda::Context> ctx;
      uint64_t base = 0;
      if (span) {
        if (auto mapping = t->deviceMapping()) {
          ctx = mapping->context();
          base = mapping->address();
        } else if (const char* host = t->mappedHost()) {
          base = reinterpret_cast<uint64_t>(host);
        } else {
          span = nullptr;
        }
      }
      if (!span) {
        flush();
        Fence fence;  // the lane records its own event per copy; the queue's marks are what it waits for
        for (uint64_t offset = 0; offset < item.size && !stopping(); offset += chunkSize_) {
          uint64_t length = std::min(chunkSize_, item.size - offset);
          beforeCopy(item.name);
          t->copyIn(offset, src + offset, length, lane_, 0, fence);
          auto mapping = t->deviceMapping();
          issued(length, mapping ? mapping->context() : nullptr);
        }
        continue;
      }
      for (uint64_t offset = 0; offset < item.size && !stopping();) {
        uint64_t length = std::min(chunkSize_ - run.length, item.size - offset);  // run.length < chunkSize_ here
        bool joins = run.length > 0 && run.span == span && run.ctx == ctx && run.target + run.length == base + offset &&
                     run.src + run.length == src + offset;
        if (!joins) {
          flush();
          length = std::min(chunkSize_, item.size - offset);
          run.span = span;
          run.ctx = ctx;
          run.target = base + offset;
          run.src = src + offset;
          run.name = item.name;
        }
        run.length += length;
        offset += length;
        if (run.length == chunkSize_) flush();
      }
    }
    if (!stopping()) flush();
  } catch (const NativeError& e) {
    outcome->error = e;
  } catch (const std::exception& e) {
    outcome->error = NativeError("E_INTERNAL", std::string("copy queue failed: ") + e.what());
  }
  if (outcome->error) {
    // Sticky: every later batch settles with the same error.
    if (!failed_.load()) {
      error_ = outcome->error;
      failed_ = true;
    }
  } else if (failed_.load()) {
    outcome->error = error_;
  } else if (cancelled_.load()) {
    outcome->error = aborted(label_);
  }
  try {
    mark(true);
  } catch (const NativeError& e) {
    // The event could not be recorded: wait for every stream here instead, then settle.
    try {
      lane_.synchronize();
    } catch (...) {
    }
    if (!outcome->error) outcome->error = e;
    if (!failed_.load()) {
      error_ = outcome->error;
      failed_ = true;
    }
    Mark m;
    m.last = true;
    m.outcome = outcome;
    m.regions = std::move(regions);
    pushMark(std::move(m));
  }
}

void CopyQueue::waiter() {
  while (true) {
    Mark m;
    {
      std::unique_lock<std::mutex> lock(marksMutex_);
      while (marks_.empty() && !issuerDone_) marksCv_.wait_for(lock, std::chrono::milliseconds(100));
      if (marks_.empty()) break;
      m = std::move(marks_.front());
      marks_.pop_front();
    }
    std::optional<NativeError> failure;
    for (auto& event : m.events) {
      try {
        while (!event->done()) std::this_thread::sleep_for(kPoll);
      } catch (const NativeError& e) {
        if (!failure) failure = e;
      }
    }
    landed_ += m.bytes;
    if (m.bytes > 0 && progress_) progress_(landed_.load());
    if (!m.last) continue;
    m.events.clear();
    m.regions.clear();  // nothing is in flight into them any more
    BatchOutcome& outcome = *m.outcome;
    if (failure && !outcome.error) outcome.error = failure;
    outcome.landedAt = now();
    settled_(outcome);
  }
}

}  // namespace vsnap::transfer
