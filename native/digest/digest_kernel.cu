// The GPU digest kernels (see digest_mix.h for the function). Block b digests one slice of one
// chunk: it reads it as 16-byte vectors (streaming loads, four in flight per thread) and writes
// its partial sums to partials[2b], partials[2b+1]; the host adds a chunk's partials in block
// order and finishes. vsnap_digest_chunks: one region a launch, block b on slice
// (b % blocksPerChunk) of chunk (b / blocksPerChunk). vsnap_digest_spans: many regions in one
// launch, each block finding its region in a table, so thousands of small regions fill the GPU as
// one large one does (one launch a 4 MiB region runs a handful of blocks).
// Compiled by gen-kernel.mjs to PTX (compute_80, JIT on sm_80+) and an sm_90 cubin, embedded.
#include "digest_mix.h"

namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ void absorbVector(vsnap_gd1::Acc& acc, const uint4& x, unsigned long long v) {
  uint32_t t = static_cast<uint32_t>(2 * v);
  vsnap_gd1::absorb(acc, (static_cast<uint64_t>(x.y) << 32) | x.x, t);
  vsnap_gd1::absorb(acc, (static_cast<uint64_t>(x.w) << 32) | x.z, t + 1);
}

// One block's work: slice `slice` of chunk `chunk` of the region at base; its sums go to out[0..1].
__device__ __forceinline__ void digestSlice(const unsigned char* base, unsigned long long size, unsigned long long chunkSize,
                                            unsigned long long chunk, unsigned long long slice, unsigned long long spanBytes,
                                            unsigned long long* out) {
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
    out[0] = total.a;
    out[1] = total.b;
  }
}

// One region of a vsnap_digest_spans launch (the table is in device memory, in region order):
// its blocks are firstBlock .. firstBlock + chunks * blocksPerChunk - 1.
struct DigestSpanDesc {
  unsigned long long base;
  unsigned long long size;
  unsigned long long chunkSize;
  unsigned long long firstBlock;
  unsigned long long blocksPerChunk;
};

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
vsnap_digest_chunks(const unsigned char* base, unsigned long long size, unsigned long long chunkSize,
                    unsigned int blocksPerChunk, unsigned long long spanBytes, unsigned long long* partials) {
  const unsigned long long b = blockIdx.x;
  digestSlice(base, size, chunkSize, b / blocksPerChunk, b % blocksPerChunk, spanBytes, partials + 2 * b);
}

extern "C" __global__ void __launch_bounds__(kThreads)
vsnap_digest_spans(const DigestSpanDesc* spans, unsigned int count, unsigned long long spanBytes, unsigned long long* partials) {
  // The region of this block: the last whose firstBlock <= b (every region has at least one block).
  __shared__ unsigned int region;
  const unsigned long long b = blockIdx.x;
  if (threadIdx.x == 0) {
    unsigned int lo = 0, hi = count;
    while (hi - lo > 1) {
      unsigned int mid = lo + (hi - lo) / 2;
      if (spans[mid].firstBlock <= b) lo = mid;
      else hi = mid;
    }
    region = lo;
  }
  __syncthreads();
  const DigestSpanDesc s = spans[region];
  const unsigned long long local = b - s.firstBlock;
  digestSlice(reinterpret_cast<const unsigned char*>(s.base), s.size, s.chunkSize, local / s.blocksPerChunk,
              local % s.blocksPerChunk, spanBytes, partials + 2 * b);
}
