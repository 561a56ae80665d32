// vsnap-c1 kernels (docs/compression.md), built into codec_kernel.inc by gen-kernel.mjs and
// loaded with the driver API (codec_gpu.cc). One CUDA block of 256 threads handles one
// 4096-element block of the format, 16 elements a thread; every thread's codes and rest bits
// are whole bytes (16 fields of w bits), so no thread shares a byte with another.
// Every section offset comes from the host, which checked the header (codec.cc parse); the
// kernels bound every read by it and flag (errors[0] != 0) a block whose escapes disagree with
// its block table, instead of reading past the exception list.
#include "codec_format.h"

using namespace vsnap_c1;

namespace {

struct Params {
  unsigned long long elems, tableOff, blockOffOff, codesOff, restOff, tailOff, excOff, tailBytes, exceptionCount;
  unsigned int blockCount, width;
};

template <unsigned K>
struct KindC {
  static constexpr KindInfo ki = kindInfo(K);
  static constexpr unsigned E = ki.elemBytes, R = ki.restBits;
};

// Exclusive prefix sum of v over the block (256 threads); *total gets the sum.
__device__ unsigned blockScan(unsigned v, unsigned* total) {
  __shared__ unsigned warpSums[kThreads / 32];
  unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned x = v;
  for (unsigned d = 1; d < 32; d <<= 1) {
    unsigned y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warpSums[warp] = x;
  __syncthreads();
  unsigned before = 0, all = 0;
  for (unsigned i = 0; i < kThreads / 32; i++) {
    unsigned s = warpSums[i];
    if (i < warp) before += s;
    all += s;
  }
  __syncthreads();
  *total = all;
  return before + x - v;
}

__device__ void zeroRange(unsigned char* out, unsigned long long from, unsigned long long to) {
#pragma unroll 1
  for (unsigned long long i = from; i < to; i++) out[i] = 0;
}

// Copies n bytes global -> shared (vectors when both are 16-aligned and n a multiple of 16).
__device__ void loadBytes(unsigned char* dst, const unsigned char* src, unsigned n) {
  if ((n & 15) == 0 && ((unsigned long long)src & 15) == 0) {
    for (unsigned i = threadIdx.x; i < n / 16; i += kThreads) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
#pragma unroll 1
    for (unsigned i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
  }
}
__device__ void storeBytes(unsigned char* dst, const unsigned char* src, unsigned n) {
  if ((n & 15) == 0 && ((unsigned long long)dst & 15) == 0) {
    for (unsigned i = threadIdx.x; i < n / 16; i += kThreads) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
#pragma unroll 1
    for (unsigned i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
  }
}

// Reads 16 fields of `bits` (<= 24) bits, LSB first, from 2*bits bytes of shared memory (and
// up to 3 bytes past them, which the buffers pad: a field is cut from a 32-bit window).
__device__ void unpack16(const unsigned char* p, unsigned bits, unsigned* f) {
  const unsigned mask = (1u << bits) - 1;
#pragma unroll
  for (unsigned k = 0; k < 16; k++) {
    unsigned at = k * bits, q = at >> 3;
    unsigned window = p[q] | (unsigned)p[q + 1] << 8 | (unsigned)p[q + 2] << 16 | (unsigned)p[q + 3] << 24;
    f[k] = (window >> (at & 7)) & mask;
  }
}
__device__ void pack16(unsigned char* p, unsigned bits, const unsigned* f) {
  unsigned long long acc = 0;
  unsigned n = 0, at = 0;
#pragma unroll 1
  for (unsigned k = 0; k < 16; k++) {
    acc |= (unsigned long long)f[k] << n;
    n += bits;
    while (n >= 8) {
      p[at++] = (unsigned char)acc;
      acc >>= 8;
      n -= 8;
    }
  }
}

// Loads a thread's m (<= 16) elements; vector loads when all 16 are there and aligned.
template <unsigned E>
__device__ void loadElems(const unsigned char* src, unsigned m, unsigned* v) {
  if (m == 16 && ((unsigned long long)src & 15) == 0) {
    unsigned words[4 * E];
    for (unsigned q = 0; q < E; q++) {
      uint4 x = reinterpret_cast<const uint4*>(src)[q];
      words[4 * q] = x.x, words[4 * q + 1] = x.y, words[4 * q + 2] = x.z, words[4 * q + 3] = x.w;
    }
    for (unsigned k = 0; k < 16; k++) {
      if (E == 4) v[k] = words[k];
      if (E == 2) v[k] = (words[k / 2] >> (16 * (k & 1))) & 0xffffu;
      if (E == 1) v[k] = (words[k / 4] >> (8 * (k & 3))) & 0xffu;
    }
    return;
  }
#pragma unroll 1
  for (unsigned k = 0; k < 16; k++) {
    unsigned x = 0;
    if (k < m) {
      for (unsigned b = 0; b < E; b++) x |= (unsigned)src[k * E + b] << (8 * b);
    }
    v[k] = x;
  }
}

template <unsigned E>
__device__ void storeElems(unsigned char* dst, unsigned m, const unsigned* v) {
  if (m == 16 && ((unsigned long long)dst & 15) == 0) {
    unsigned words[4 * E];
    for (unsigned i = 0; i < 4 * E; i++) words[i] = 0;
    for (unsigned k = 0; k < 16; k++) {
      if (E == 4) words[k] = v[k];
      if (E == 2) words[k / 2] |= v[k] << (16 * (k & 1));
      if (E == 1) words[k / 4] |= v[k] << (8 * (k & 3));
    }
    for (unsigned q = 0; q < E; q++) reinterpret_cast<uint4*>(dst)[q] = make_uint4(words[4 * q], words[4 * q + 1], words[4 * q + 2], words[4 * q + 3]);
    return;
  }
#pragma unroll 1
  for (unsigned k = 0; k < m; k++) {
    for (unsigned b = 0; b < E; b++) dst[k * E + b] = (unsigned char)(v[k] >> (8 * b));
  }
}

template <unsigned K>
__device__ void decodeBlock(const unsigned char* in, unsigned char* out, const Params& p, unsigned* errors) {
  using C = KindC<K>;
  constexpr KindInfo ki = C::ki;
  __shared__ unsigned char table[256];
  __shared__ __align__(16) unsigned char codes[kBlockElems + 16];
  __shared__ __align__(16) unsigned char rest[kBlockElems / 8 * (C::R ? C::R : 1) + 16];
  const unsigned b = blockIdx.x, w = p.width, esc = escapeCode(w);
  const unsigned long long first = (unsigned long long)b * kBlockElems;
  const unsigned count = (unsigned)min((unsigned long long)kBlockElems, p.elems - first);
  if (threadIdx.x < tableEntries(w)) table[threadIdx.x] = in[p.tableOff + threadIdx.x];
  loadBytes(codes, in + p.codesOff + first / 8 * w, (count * w + 7) / 8);
  if (C::R) loadBytes(rest, in + p.restOff + first / 8 * C::R, (count * C::R + 7) / 8);
  const unsigned* offs = reinterpret_cast<const unsigned*>(in + p.blockOffOff);
  unsigned long long start = offs[b];
  unsigned long long end = b + 1 < p.blockCount ? offs[b + 1] : p.exceptionCount;
  __syncthreads();
  const unsigned i0 = threadIdx.x * 16;
  const unsigned m = i0 < count ? min(16u, count - i0) : 0;
  unsigned code[16], r[16];
  if (w) {
    unpack16(codes + 2 * w * threadIdx.x, w, code);
  } else {
    for (unsigned k = 0; k < 16; k++) code[k] = 0;
  }
  if (C::R) {
    unpack16(rest + 2 * C::R * threadIdx.x, C::R, r);
  } else {
    for (unsigned k = 0; k < 16; k++) r[k] = 0;
  }
  unsigned mine = 0;
  for (unsigned k = 0; k < m; k++) mine += code[k] == esc;
  unsigned total;
  unsigned long long at = start + blockScan(mine, &total);
  bool bad = start > end || end > p.exceptionCount || start + total != end;
  if (bad && threadIdx.x == 0) atomicOr(errors, 1u);
  unsigned v[16];
  for (unsigned k = 0; k < 16; k++) {
    unsigned sym;
    if (code[k] == esc && k < m) {
      sym = (!bad && at < end) ? in[p.excOff + at] : 0;  // never past the exception list
      if (sym >> ki.expBits) atomicOr(errors, 1u);         // not a symbol of the kind (the CPU refuses it too)
      at++;
    } else {
      sym = table[code[k] & 255];
    }
    v[k] = joinElement(sym & ((1u << ki.expBits) - 1), r[k], ki);
  }
  storeElems<C::E>(out + (first + i0) * C::E, m, v);
  if (b + 1 == p.blockCount && threadIdx.x == 0) {
#pragma unroll 1
    for (unsigned i = 0; i < p.tailBytes; i++) out[p.elems * C::E + i] = in[p.tailOff + i];
  }
}

// Symbol histograms: hist[0..255] of the kind's symbols, hist[256..511] of the bytes.
template <unsigned K>
__device__ void histogram(const unsigned char* src, unsigned long long size, unsigned* hist) {
  using C = KindC<K>;
  __shared__ unsigned h[512];
  for (unsigned i = threadIdx.x; i < 512; i += kThreads) h[i] = 0;
  __syncthreads();
  const unsigned long long vectors = (size + 15) / 16, elems = size / C::E;
  const unsigned lane = threadIdx.x & 31;
  // the loop runs the same number of times in every lane of a warp (match needs them all)
  const unsigned long long stride = (unsigned long long)gridDim.x * kThreads;
  const unsigned long long base0 = (unsigned long long)blockIdx.x * kThreads + threadIdx.x - lane;
  for (unsigned long long base = base0; base < vectors; base += stride) {
    unsigned long long vi = base + lane;
    unsigned char bytes[16];
    bool full = vi < vectors && (vi + 1) * 16 <= size;
    if (full) {
      uint4 x = reinterpret_cast<const uint4*>(src)[vi];
      unsigned words[4] = {x.x, x.y, x.z, x.w};
      for (unsigned i = 0; i < 16; i++) bytes[i] = (unsigned char)(words[i / 4] >> (8 * (i & 3)));
    } else {
      for (unsigned i = 0; i < 16; i++) bytes[i] = vi * 16 + i < size ? src[vi * 16 + i] : 0;
    }
    for (unsigned i = 0; i < 16; i++) {
      bool valid = vi * 16 + i < size;
      unsigned key = valid ? 256u + bytes[i] : 1024u;
      unsigned peers = __match_any_sync(0xffffffffu, key);
      if (valid && lane == __ffs(peers) - 1) atomicAdd(&h[key], __popc(peers));
    }
    for (unsigned k = 0; k < 16 / C::E; k++) {
      unsigned long long e = vi * (16 / C::E) + k;
      bool valid = e < elems;
      unsigned x = 0;
      for (unsigned b = 0; b < C::E; b++) x |= (unsigned)bytes[k * C::E + b] << (8 * b);
      unsigned key = valid ? symbolOf(x, C::ki) : 1024u;
      unsigned peers = __match_any_sync(0xffffffffu, key);
      if (valid && lane == __ffs(peers) - 1) atomicAdd(&h[key], __popc(peers));
    }
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < 512; i += kThreads) {
    if (h[i]) atomicAdd(&hist[i], h[i]);
  }
}

// Codes and rest bits of a block, its escape count into counts[b]; the last block also writes
// the tail and zeroes the padding between sections.
template <unsigned K>
__device__ void encodeBlock(const unsigned char* src, unsigned char* out, const Params& p, const unsigned char* codeOf, unsigned* counts) {
  using C = KindC<K>;
  constexpr KindInfo ki = C::ki;
  __shared__ unsigned char map[256];
  __shared__ __align__(16) unsigned char codes[kBlockElems + 16];
  __shared__ __align__(16) unsigned char rest[kBlockElems / 8 * (C::R ? C::R : 1) + 16];
  const unsigned b = blockIdx.x, w = p.width, esc = escapeCode(w);
  const unsigned long long first = (unsigned long long)b * kBlockElems;
  const unsigned count = (unsigned)min((unsigned long long)kBlockElems, p.elems - first);
  map[threadIdx.x] = codeOf[threadIdx.x];  // 256 threads, 256 symbols
  __syncthreads();
  const unsigned i0 = threadIdx.x * 16;
  const unsigned m = i0 < count ? min(16u, count - i0) : 0;
  unsigned v[16], code[16], r[16];
  loadElems<C::E>(src + (first + i0) * C::E, m, v);
  unsigned mine = 0;
  for (unsigned k = 0; k < 16; k++) {
    unsigned c = map[symbolOf(v[k], ki)];  // 255: escape
    unsigned cc = w == 0 ? 0 : c == 255 ? esc : c;
    code[k] = k < m ? cc : 0;
    r[k] = k < m ? restOf(v[k], ki) : 0;
    mine += k < m && c == 255;
  }
  if (w) pack16(codes + 2 * w * threadIdx.x, w, code);
  if (C::R) pack16(rest + 2 * C::R * threadIdx.x, C::R, r);
  unsigned total;
  blockScan(mine, &total);  // also syncs the packed bytes
  storeBytes(out + p.codesOff + first / 8 * w, codes, (count * w + 7) / 8);
  if (C::R) storeBytes(out + p.restOff + first / 8 * C::R, rest, (count * C::R + 7) / 8);
  if (threadIdx.x == 0) counts[b] = total;
  if (b + 1 == p.blockCount && threadIdx.x == 0) {
    zeroRange(out, p.codesOff + streamBytes(p.elems, w), p.restOff);
    zeroRange(out, p.restOff + streamBytes(p.elems, C::R), p.tailOff);
#pragma unroll 1
    for (unsigned i = 0; i < p.tailBytes; i++) out[p.tailOff + i] = src[p.elems * C::E + i];
    zeroRange(out, p.tailOff + p.tailBytes, p.excOff);
  }
}

// Writes each block's escaped symbols at its offset in the exception list.
template <unsigned K>
__device__ void exceptionsBlock(const unsigned char* src, unsigned char* out, const Params& p, const unsigned char* codeOf, unsigned* errors) {
  using C = KindC<K>;
  constexpr KindInfo ki = C::ki;
  __shared__ unsigned char map[256];
  const unsigned b = blockIdx.x;
  const unsigned long long first = (unsigned long long)b * kBlockElems;
  const unsigned count = (unsigned)min((unsigned long long)kBlockElems, p.elems - first);
  map[threadIdx.x] = codeOf[threadIdx.x];
  __syncthreads();
  const unsigned i0 = threadIdx.x * 16;
  const unsigned m = i0 < count ? min(16u, count - i0) : 0;
  unsigned v[16];
  loadElems<C::E>(src + (first + i0) * C::E, m, v);
  unsigned mine = 0;
  for (unsigned k = 0; k < m; k++) mine += map[symbolOf(v[k], ki)] == 255;
  unsigned total;
  unsigned long long at = reinterpret_cast<const unsigned*>(out + p.blockOffOff)[b] + blockScan(mine, &total);
  for (unsigned k = 0; k < m; k++) {
    unsigned s = symbolOf(v[k], ki);
    if (map[s] != 255) continue;
    if (at < p.exceptionCount) out[p.excOff + at] = (unsigned char)s;
    else atomicOr(errors, 2u);
    at++;
  }
}

}  // namespace

// codeOf: 256 bytes, a symbol's code, 255 for an escape (w = 0: 0 for the one symbol).
#define VSC_KINDS(X) X(1) X(2) X(3) X(4) X(5) X(6)
#define VSC_DECODE(k)                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads) vsc_decode_##k(const unsigned char* in, unsigned char* out, Params p, unsigned* errors) { \
    decodeBlock<k>(in, out, p, errors);                                                                 \
  }                                                                                                     \
  extern "C" __global__ void __launch_bounds__(kThreads) vsc_hist_##k(const unsigned char* src, unsigned long long size, unsigned* hist) { \
    histogram<k>(src, size, hist);                                                                      \
  }                                                                                                     \
  extern "C" __global__ void __launch_bounds__(kThreads) vsc_encode_##k(const unsigned char* src, unsigned char* out, Params p, const unsigned char* codeOf, unsigned* counts) { \
    encodeBlock<k>(src, out, p, codeOf, counts);                                                        \
  }                                                                                                     \
  extern "C" __global__ void __launch_bounds__(kThreads) vsc_exceptions_##k(const unsigned char* src, unsigned char* out, Params p, const unsigned char* codeOf, unsigned* errors) { \
    exceptionsBlock<k>(src, out, p, codeOf, errors);                                                    \
  }
VSC_KINDS(VSC_DECODE)

// Block offsets: an exclusive scan of the blocks' escape counts, by one block of 1024 threads;
// flags errors bit 2 when the total differs from the exception count the histogram promised.
extern "C" __global__ void __launch_bounds__(1024) vsc_offsets(const unsigned* counts, unsigned char* out, Params p, unsigned* errors) {
  __shared__ unsigned sums[1024];
  unsigned* offs = reinterpret_cast<unsigned*>(out + p.blockOffOff);
  unsigned long long carry = 0;
  for (unsigned base = 0; base < p.blockCount; base += 1024) {
    unsigned i = base + threadIdx.x;
    unsigned v = i < p.blockCount ? counts[i] : 0;
    sums[threadIdx.x] = v;
    __syncthreads();
    for (unsigned d = 1; d < 1024; d <<= 1) {
      unsigned y = threadIdx.x >= d ? sums[threadIdx.x - d] : 0;
      __syncthreads();
      sums[threadIdx.x] += y;
      __syncthreads();
    }
    if (i < p.blockCount) offs[i] = (unsigned)(carry + sums[threadIdx.x] - v);
    carry += sums[1023];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (carry != p.exceptionCount) atomicOr(errors, 4u);
    zeroRange(out, p.blockOffOff + 4ull * p.blockCount, p.codesOff);
  }
}
