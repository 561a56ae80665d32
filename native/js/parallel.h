// parallelFor: runs fn(i) for every i in [0, n) on up to `threads` threads, the calling one
// included. A thread that cannot be started (EAGAIN under a pids cap) is not an error: the
// threads that did start, and the calling one, share the work. The first exception is rethrown
// once every thread has stopped (the others stop taking new items).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace vsnap::js {

inline void parallelFor(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex errorMutex;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  size_t extra = std::min(n, threads);
  pool.reserve(extra);
  for (size_t t = 1; t < extra; t++) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace vsnap::js
