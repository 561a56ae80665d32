// The GPU digest kernel (see digest_mix.h for the function). One launch digests one region:
// block b works on slice (b % blocksPerChunk) of chunk (b / blocksPerChunk), reads it as
// 16-byte vectors (streaming loads, four in flight per thread), and writes its partial sums to
// partials[2b], partials[2b+1]; the host adds a chunk's partials in block order and finishes.
// Compiled by gen-kernel.mjs to PTX (compute_80, JIT on sm_80+) and an sm_90 cubin, embedded.
#include "digest_mix.h"

namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ void absorbVector(vsnap_gd1::Acc& acc, const uint4& x, unsigned long long v) {
  uint32_t t = static_cast<uint32_t>(2 * v);
  vsnap_gd1::absorb(acc, (static_cast<uint64_t>(x.y) << 32) | x.x, t);
  vsnap_gd1::absorb(acc, (static_cast<uint64_t>(x.w) << 32) | x.z, t + 1);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
vsnap_digest_chunks(const unsigned char* base, unsigned long long size, unsigned long long chunkSize,
                    unsigned int blocksPerChunk, unsigned long long spanBytes, unsigned long long* partials) {
  const unsigned long long chunk = blockIdx.x / blocksPerChunk;
  const unsigned long long slice = blockIdx.x % blocksPerChunk;
  const unsigned long long chunkStart = chunk * chunkSize;
  const unsigned long long chunkLen = min(chunkSize, size - chunkStart);
  const unsigned long long begin = min(slice * spanBytes, chunkLen);
  const unsigned long long end = min(begin + spanBytes, chunkLen);
  const unsigned char* p = base + chunkStart;
  const uint4* q = reinterpret_cast<const uint4*>(p);
  vsnap_gd1::Acc acc{0, 0};

  const unsigned long long vend = end / 16;
  const unsigned long long step = blockDim.x;
  unsigned long long v = begin / 16 + threadIdx.x;
  for (; v + 3 * step < vend; v += 4 * step) {
    uint4 x0 = __ldcs(q + v), x1 = __ldcs(q + v + step), x2 = __ldcs(q + v + 2 * step), x3 = __ldcs(q + v + 3 * step);
    absorbVector(acc, x0, v);
    absorbVector(acc, x1, v + step);
    absorbVector(acc, x2, v + 2 * step);
    absorbVector(acc, x3, v + 3 * step);
  }
  for (; v < vend; v += step) absorbVector(acc, __ldcs(q + v), v);
  // The chunk's last bytes when its length is not a multiple of 16 (only the last slice has them).
  if (threadIdx.x == 0) {
    for (unsigned long long at = vend * 16 > begin ? vend * 16 : begin; at < end; at += 8) {
      unsigned long long count = end - at < 8 ? end - at : 8;
      vsnap_gd1::absorb(acc, vsnap_gd1::tailWord(p + at, static_cast<uint32_t>(count)), static_cast<uint32_t>(at / 8));
    }
  }

  // Fixed-order block reduction: a shuffle tree per warp, then warp 0 adds the warps in order.
  for (int offset = 16; offset > 0; offset /= 2) {
    acc.a += __shfl_down_sync(0xffffffffu, acc.a, offset);
    acc.b += __shfl_down_sync(0xffffffffu, acc.b, offset);
  }
  __shared__ unsigned long long warpA[kThreads / 32], warpB[kThreads / 32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warpA[warp] = acc.a;
    warpB[warp] = acc.b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    vsnap_gd1::Acc total{0, 0};
    for (unsigned w = 0; w < blockDim.x / 32; w++) vsnap_gd1::merge(total, vsnap_gd1::Acc{warpA[w], warpB[w]});
    partials[2 * static_cast<unsigned long long>(blockIdx.x)] = total.a;
    partials[2 * static_cast<unsigned long long>(blockIdx.x) + 1] = total.b;
  }
}
