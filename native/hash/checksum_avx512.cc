// XXH3-128 compiled for avx512 (target flags in binding.gyp).
#include "hash/checksum.h"
#include "hash/xxh3_impl.inc"

namespace vsnap::hash {
const Impl kAvx512{"avx512", xxCreate, xxDestroy, xxReset, xxUpdate, xxFinish, xxOneShot};
}  // namespace vsnap::hash
