// Fault injection for tests (the binding's setFault): a named point fails, or waits, the next
// N times it is reached. Process-wide; unset points cost one relaxed atomic load.
//   "thread-start"  a transfer's worker thread fails to start (as std::thread does on EAGAIN),
//                   after `arg` starts have been let through
//   "chunk-delay"   each transfer chunk waits `arg` ms first (keeps a transfer running)
//   "map-import", "map-reserve", "map-map", "map-access": a batched region-set open
//                   (transfer/region_batch.h) fails at that step, after `arg` hits let through
//   "copy-fail"     a copy queue's chunk (transfer/copy_queue.h) fails, after `arg` chunks let through
//   "codec-scratch" a coded capture's device scratch (codec/codec_capture.h) is refused as out of
//                   memory, after `arg` allocations let through
//   "codec-restore-scratch" a coded restore's device scratch (codec/codec_restore.h) is refused as
//                   out of memory, after `arg` allocations let through
#pragma once

#include <cstdint>
#include <string>

namespace vsnap::fault {

enum class Point { ThreadStart = 0, ChunkDelay = 1, MapImport = 2, MapReserve = 3, MapMap = 4, MapAccess = 5, CopyFail = 6, CodecScratch = 7, CodecRestoreScratch = 8, Count = 9 };

// Arms `point` for the next `times` hits (0 disarms) with an argument (ChunkDelay: ms).
void set(Point point, uint32_t times, uint32_t arg = 0);
// Throws E_INVALID_ARGUMENT for an unknown name.
Point parse(const std::string& name);
// True (and counts one hit) when the point is armed.
bool hit(Point point);
uint32_t arg(Point point);

}  // namespace vsnap::fault
