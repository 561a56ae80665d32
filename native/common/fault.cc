#include "common/fault.h"

#include <atomic>

#include "common/error.h"

namespace vsnap::fault {
namespace {

struct Armed {
  std::atomic<uint32_t> remaining{0};
  std::atomic<uint32_t> arg{0};
};
Armed table[static_cast<int>(Point::Count)];

}  // namespace

void set(Point point, uint32_t times, uint32_t arg) {
  Armed& a = table[static_cast<int>(point)];
  a.arg = arg;
  a.remaining = times;
}

Point parse(const std::string& name) {
  if (name == "thread-start") return Point::ThreadStart;
  if (name == "chunk-delay") return Point::ChunkDelay;
  if (name == "map-import") return Point::MapImport;
  if (name == "map-reserve") return Point::MapReserve;
  if (name == "map-map") return Point::MapMap;
  if (name == "map-access") return Point::MapAccess;
  if (name == "copy-fail") return Point::CopyFail;
  if (name == "codec-scratch") return Point::CodecScratch;
  if (name == "codec-restore-scratch") return Point::CodecRestoreScratch;
  throwInvalid("unknown fault point '" + name + "' (thread-start, chunk-delay, map-import, map-reserve, map-map, map-access, copy-fail, codec-scratch, codec-restore-scratch)");
}

bool hit(Point point) {
  Armed& a = table[static_cast<int>(point)];
  if (a.remaining.load(std::memory_order_relaxed) == 0) return false;
  if (point != Point::ChunkDelay) {  // let `arg` hits through first
    uint32_t skip = a.arg.load();
    while (skip > 0) {
      if (a.arg.compare_exchange_weak(skip, skip - 1)) return false;
    }
  }
  uint32_t n = a.remaining.load(std::memory_order_relaxed);
  while (n > 0) {
    if (a.remaining.compare_exchange_weak(n, n - 1)) return true;
  }
  return false;
}

uint32_t arg(Point point) { return table[static_cast<int>(point)].arg.load(); }

}  // namespace vsnap::fault
