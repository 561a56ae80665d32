// XXH3-128 compiled for the architecture's baseline: SSE2 on x86-64, NEON on arm64 (where
// xxHash picks NEON at compile time; every ARMv8-A core has it), else xxHash's scalar code.
#include "hash/checksum.h"
#include "hash/xxh3_impl.inc"

namespace vsnap::hash {
#if defined(__x86_64__)
const Impl kBase{"sse2", xxCreate, xxDestroy, xxReset, xxUpdate, xxFinish, xxOneShot};
#elif defined(__aarch64__) && XXH_VECTOR == XXH_NEON
const Impl kBase{"neon", xxCreate, xxDestroy, xxReset, xxUpdate, xxFinish, xxOneShot};
#else
const Impl kBase{"scalar", xxCreate, xxDestroy, xxReset, xxUpdate, xxFinish, xxOneShot};
#endif
}  // namespace vsnap::hash
