#include "js/js_lifecycle.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "transfer/engine.h"

namespace vsnap::js {
namespace {

constexpr int kStopWaitMs = 30000;  // a cancelled transfer stops at its next chunk boundary

// Every environment's running transfers, for the atexit handler. Never destroyed: it must
// outlive static destruction, which runs after the handler.
struct Process {
  std::mutex mutex;
  std::set<std::shared_ptr<RunningJob>> jobs;
  std::map<const void*, Lifecycle::Release> atExit;
};
Process& process() {
  static Process* p = new Process();
  return *p;
}

void stopAll(std::vector<std::shared_ptr<RunningJob>> jobs) {
  for (auto& j : jobs) j->cancel();
  for (auto& j : jobs) {
    if (!j->waitDone(kStopWaitMs)) std::fprintf(stderr, "vsnap: a transfer did not stop within %d ms of exit\n", kStopWaitMs);
  }
}

void atExit() {
  std::vector<std::shared_ptr<RunningJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(process().mutex);
    jobs.assign(process().jobs.begin(), process().jobs.end());
  }
  stopAll(std::move(jobs));
  std::map<const void*, Lifecycle::Release> closers;
  {
    std::lock_guard<std::mutex> lock(process().mutex);
    closers.swap(process().atExit);
  }
  for (auto& [key, close] : closers) close();
}

struct HookData {
  std::shared_ptr<Lifecycle> lifecycle;
};

}  // namespace

void RunningJob::cancel() {
  if (auto job = job_.lock()) job->cancel();
}

void RunningJob::finished() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
}

bool RunningJob::waitDone(int timeoutMs) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeoutMs), [this] { return done_; });
}

void Lifecycle::add(const std::shared_ptr<RunningJob>& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.insert(job);
  }
  std::lock_guard<std::mutex> lock(process().mutex);
  process().jobs.insert(job);
}

void Lifecycle::remove(const std::shared_ptr<RunningJob>& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.erase(job);
  }
  std::lock_guard<std::mutex> lock(process().mutex);
  process().jobs.erase(job);
}

void Lifecycle::add(const void* key, Release release) {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_[key] = std::move(release);
}

void Lifecycle::remove(const void* key) {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_.erase(key);
}

void Lifecycle::addAtExit(const void* key, Release release) {
  std::lock_guard<std::mutex> lock(process().mutex);
  process().atExit[key] = std::move(release);
}

void Lifecycle::removeAtExit(const void* key) {
  std::lock_guard<std::mutex> lock(process().mutex);
  process().atExit.erase(key);
}

void Lifecycle::stop() {
  std::vector<std::shared_ptr<RunningJob>> jobs;
  std::map<const void*, Release> objects;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    jobs.assign(jobs_.begin(), jobs_.end());
    objects.swap(objects_);
  }
  stopAll(std::move(jobs));  // first: a running transfer still uses the pools and buffers
  for (auto& [key, release] : objects) release();
}

void installLifecycle(napi_env env, const std::shared_ptr<Lifecycle>& lifecycle) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(atExit); });
  auto* data = new HookData{lifecycle};
  napi_add_env_cleanup_hook(
      env,
      [](void* arg) {
        std::unique_ptr<HookData> owned(static_cast<HookData*>(arg));
        owned->lifecycle->stop();
      },
      data);
}

}  // namespace vsnap::js
