// XXH3-128 compiled for sse2 (target flags in binding.gyp).
#include "hash/checksum.h"
#include "hash/xxh3_impl.inc"

namespace vsnap::hash {
const Impl kSse2{"sse2", xxCreate, xxDestroy, xxReset, xxUpdate, xxFinish, xxOneShot};
}  // namespace vsnap::hash
