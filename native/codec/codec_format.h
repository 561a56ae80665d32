// The "vsnap-c1" chunk format (docs/compression.md): constants, element kinds and the section
// layout, shared by the CPU codec (codec.cc), the GPU glue (codec_gpu.cc) and the kernels
// (codec_kernel.cu), so all three compute the same offsets.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define VSC_HD __host__ __device__
#else
#define VSC_HD
#endif

namespace vsnap_c1 {

constexpr uint32_t kMagic = 0x31435356u;  // "VSC1" little-endian
constexpr uint8_t kVersion = 1;
constexpr uint32_t kHeaderBytes = 64;
constexpr uint32_t kBlockElems = 4096;     // elements a block; one CUDA block decodes one
constexpr uint32_t kThreads = 256;         // kernels: 16 elements a thread
constexpr uint32_t kElemsPerThread = 16;
constexpr uint64_t kMaxPlanesRaw = 0xffffffffull;  // block offsets and counts are 32-bit

enum Mode : uint8_t { kModeRaw = 0, kModePlanes = 1 };

// Element kinds: how an element splits into a symbol (the exponent field) and the rest bits.
enum Kind : uint8_t { kBytes = 1, kBf16 = 2, kFp16 = 3, kFp32 = 4, kE4m3 = 5, kE5m2 = 6 };

struct KindInfo {
  uint32_t elemBytes;  // 1, 2 or 4
  uint32_t expShift;   // lowest bit of the exponent field
  uint32_t expBits;    // width of the exponent field (the symbol)
  uint32_t restBits;   // elemBits - expBits: sign and mantissa, kept verbatim
};

VSC_HD constexpr bool kindValid(uint32_t k) { return k >= kBytes && k <= kE5m2; }

VSC_HD constexpr KindInfo kindInfo(uint32_t k) {
  switch (k) {
    case kBf16: return {2, 7, 8, 8};
    case kFp16: return {2, 10, 5, 11};
    case kFp32: return {4, 23, 8, 24};
    case kE4m3: return {1, 3, 4, 4};
    case kE5m2: return {1, 2, 5, 3};
    default: return {1, 0, 8, 0};  // kBytes: the whole byte is the symbol
  }
}

VSC_HD inline uint64_t align16(uint64_t x) { return (x + 15) & ~uint64_t{15}; }

// Where each section of a planes-mode chunk starts (bytes from the chunk's first byte).
struct Layout {
  uint64_t elems;        // rawSize / elemBytes
  uint32_t blockCount;   // ceil(elems / kBlockElems)
  uint32_t width;        // code width w, 0..8
  uint32_t restBits;
  uint32_t elemBytes;
  uint64_t tableOff, blockOffOff, codesOff, restOff, tailOff, excOff;
  uint64_t tailBytes;    // rawSize % elemBytes
  uint64_t codedSize;    // excOff + exceptionCount
};

VSC_HD inline uint32_t tableEntries(uint32_t width) { return 1u << width; }

// Bytes of a stream of `count` fields of `bits` bits, block by block (full blocks are whole
// multiples of 16 bytes, the last one rounded up to a byte).
VSC_HD inline uint64_t streamBytes(uint64_t elems, uint32_t bits) {
  uint64_t full = elems / kBlockElems, last = elems % kBlockElems;
  return full * (kBlockElems / 8) * bits + (last * bits + 7) / 8;
}

VSC_HD inline Layout layoutOf(uint32_t kind, uint64_t rawSize, uint32_t width, uint64_t exceptionCount) {
  KindInfo ki = kindInfo(kind);
  Layout l;
  l.elemBytes = ki.elemBytes;
  l.restBits = ki.restBits;
  l.width = width;
  l.elems = rawSize / ki.elemBytes;
  l.tailBytes = rawSize % ki.elemBytes;
  l.blockCount = static_cast<uint32_t>((l.elems + kBlockElems - 1) / kBlockElems);
  l.tableOff = kHeaderBytes;
  l.blockOffOff = align16(l.tableOff + tableEntries(width));
  l.codesOff = align16(l.blockOffOff + 4ull * l.blockCount);
  l.restOff = align16(l.codesOff + streamBytes(l.elems, width));
  l.tailOff = align16(l.restOff + streamBytes(l.elems, ki.restBits));
  l.excOff = align16(l.tailOff + l.tailBytes);
  l.codedSize = l.excOff + exceptionCount;
  return l;
}

// The escape code of a width (w = 0 has no codes and so no escape).
VSC_HD inline uint32_t escapeCode(uint32_t width) { return width == 0 ? 0xffffffffu : (1u << width) - 1; }

// Splits an element into its symbol and its rest bits, and joins them again.
VSC_HD inline uint32_t symbolOf(uint32_t v, KindInfo ki) { return (v >> ki.expShift) & ((1u << ki.expBits) - 1); }
VSC_HD inline uint32_t restOf(uint32_t v, KindInfo ki) {
  uint32_t low = v & ((1u << ki.expShift) - 1);
  uint32_t high = ki.expShift + ki.expBits >= 32 ? 0 : (v >> (ki.expShift + ki.expBits));
  return (high << ki.expShift) | low;
}
VSC_HD inline uint32_t joinElement(uint32_t sym, uint32_t rest, KindInfo ki) {
  uint32_t low = rest & ((1u << ki.expShift) - 1);
  uint32_t high = rest >> ki.expShift;
  uint32_t top = ki.expShift + ki.expBits >= 32 ? 0 : (high << (ki.expShift + ki.expBits));
  return top | (sym << ki.expShift) | low;
}

}  // namespace vsnap_c1
