// What an environment must stop and release when it goes away (a worker thread terminated, the
// process ending): its running transfers are cancelled and waited for, its fd listeners closed
// (threads joined, pending offers closed) and the resources its JS objects hold (staging pools,
// host buffers, device allocations, held handles) released. Run by the environment's cleanup
// hook (napi_add_env_cleanup_hook, registered in addon.cc) and, for process.exit() (which runs
// no cleanup hooks), by an atexit handler that stops the transfers of every environment.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <set>

#include <node_api.h>

namespace vsnap::transfer {
class TransferJob;
}

namespace vsnap::js {

// A transfer in flight: cancel() then waitDone() stops it; the worker calls finished().
class RunningJob {
 public:
  explicit RunningJob(std::weak_ptr<transfer::TransferJob> job) : job_(std::move(job)) {}
  void cancel();
  void finished();
  // Waits until finished() or timeoutMs; false on timeout.
  bool waitDone(int timeoutMs);

 private:
  std::weak_ptr<transfer::TransferJob> job_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

class Lifecycle {
 public:
  using Release = std::function<void()>;

  // Tracks a running transfer (process-wide as well, for the atexit handler).
  void add(const std::shared_ptr<RunningJob>& job);
  void remove(const std::shared_ptr<RunningJob>& job);
  // An object whose release() must run at teardown; the key is its address.
  void add(const void* key, Release release);
  void remove(const void* key);

  // Also run at process exit (process.exit() runs no cleanup hooks): for what must not outlive
  // the process's own teardown and needs no JS (closing a listener's socket and offers).
  static void addAtExit(const void* key, Release release);
  static void removeAtExit(const void* key);

  // Cancels and waits for every transfer, then releases every registered object. Idempotent.
  void stop();
  bool stopping() const { return stopping_; }

 private:
  std::mutex mutex_;
  std::set<std::shared_ptr<RunningJob>> jobs_;
  std::map<const void*, Release> objects_;
  bool stopping_ = false;
};

// Registers the cleanup hook for env and the process-wide atexit handler (once).
void installLifecycle(napi_env env, const std::shared_ptr<Lifecycle>& lifecycle);

}  // namespace vsnap::js
