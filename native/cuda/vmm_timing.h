// Where the time of mapping another process's memory goes (issue 14, per-region cost): every
// VMM step of a region set's open and close adds its wall time, its calls and the regions it
// covered to process-wide totals. The host backend of a batched set (mmap) records under the
// same steps. Read by the binding's vmmTimings() (a bench takes the difference around a run);
// the `items` of import/release, reserve/addressFree and map/unmap also balance when nothing
// leaked, which the fault-injection tests check.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>

namespace vsnap::cuda {

// setup: per-region bookkeeping around the VMM calls (granularity queries, context acquisition).
enum class VmmStep { Import, Props, Setup, Reserve, Map, Access, Unmap, AddressFree, Release, CloseFd, Count };

struct VmmStepTotal {
  uint64_t calls = 0;  // driver (or system) calls
  uint64_t items = 0;  // regions they covered (one cuMemSetAccess over 4,000 regions: 1 call, 4,000 items)
  uint64_t ns = 0;     // summed wall time of the calls (on every thread that made them)
};
using VmmTotals = std::array<VmmStepTotal, static_cast<size_t>(VmmStep::Count)>;

const char* vmmStepName(VmmStep step);
void vmmRecord(VmmStep step, uint64_t ns, uint64_t items = 1);
VmmTotals vmmTotals();

// Times one call: `VmmTimer t(VmmStep::Map); check(cuMemMap(...));` records when it goes out of
// scope; left by an exception (the call failed), it records the call but no region.
class VmmTimer {
 public:
  explicit VmmTimer(VmmStep step, uint64_t items = 1)
      : step_(step), items_(items), unwinding_(std::uncaught_exceptions()), start_(std::chrono::steady_clock::now()) {}
  ~VmmTimer() {
    uint64_t ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
    vmmRecord(step_, ns, std::uncaught_exceptions() > unwinding_ ? 0 : items_);
  }
  // The call failed without throwing: it covered no region.
  void fail() { items_ = 0; }
  VmmTimer(const VmmTimer&) = delete;
  VmmTimer& operator=(const VmmTimer&) = delete;

 private:
  VmmStep step_;
  uint64_t items_;
  int unwinding_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace vsnap::cuda
