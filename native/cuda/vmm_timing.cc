#include "cuda/vmm_timing.h"

#include <atomic>

namespace vsnap::cuda {
namespace {

struct Counter {
  std::atomic<uint64_t> calls{0}, items{0}, ns{0};
};
Counter counters[static_cast<size_t>(VmmStep::Count)];

}  // namespace

const char* vmmStepName(VmmStep step) {
  switch (step) {
    case VmmStep::Import: return "import";
    case VmmStep::Props: return "props";
    case VmmStep::Setup: return "setup";
    case VmmStep::Reserve: return "reserve";
    case VmmStep::Map: return "map";
    case VmmStep::Access: return "access";
    case VmmStep::Unmap: return "unmap";
    case VmmStep::AddressFree: return "addressFree";
    case VmmStep::Release: return "release";
    case VmmStep::CloseFd: return "closeFd";
    case VmmStep::Count: break;
  }
  return "?";
}

void vmmRecord(VmmStep step, uint64_t ns, uint64_t items) {
  Counter& c = counters[static_cast<size_t>(step)];
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.items.fetch_add(items, std::memory_order_relaxed);
  c.ns.fetch_add(ns, std::memory_order_relaxed);
}

VmmTotals vmmTotals() {
  VmmTotals out;
  for (size_t i = 0; i < out.size(); i++) out[i] = {counters[i].calls.load(), counters[i].items.load(), counters[i].ns.load()};
  return out;
}

}  // namespace vsnap::cuda
