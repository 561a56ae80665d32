#include "digest/digest.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/driver.h"
#include "digest/digest_mix.h"

namespace vsnap::digest {
namespace {

#include "digest/digest_kernel.inc"

constexpr unsigned kThreads = 256;            // digest_kernel.cu's block size
constexpr uint64_t kSpanBytes = 1ull << 20;   // bytes per block: 16 GiB -> 16384 blocks

// The kernels, loaded once per live context (a context's modules go with it).
struct Kernels {
  CUfunction chunks = nullptr;  // one region a launch (the bench)
  CUfunction spans = nullptr;   // many regions a launch (digestDevice)
};
struct Loaded {
  std::weak_ptr<cuda::Context> ctx;
  CUmodule module = nullptr;
  Kernels kernels;
};
std::mutex gMutex;
std::map<int, Loaded> gLoaded;

Kernels kernelsFor(const std::shared_ptr<cuda::Context>& ctx) {
  std::lock_guard<std::mutex> lock(gMutex);
  Loaded& l = gLoaded[ctx->ordinal()];
  if (l.ctx.lock() == ctx && l.kernels.chunks) return l.kernels;
  const cuda::Api& cu = cuda::api();
  CUmodule module = nullptr;
  cuda::check(cu.cuModuleLoadData(&module, kDigestFatbin), "cuModuleLoadData (digest kernel)");
  Kernels k;
  for (auto [fn, name] : {std::pair<CUfunction*, const char*>{&k.chunks, "vsnap_digest_chunks"}, {&k.spans, "vsnap_digest_spans"}}) {
    CUresult r = cu.cuModuleGetFunction(fn, module, name);
    if (r != CUDA_SUCCESS) {
      cu.cuModuleUnload(module);
      const std::string call = std::string("cuModuleGetFunction (") + name + ")";
      cuda::check(r, call.c_str());
    }
  }
  l = Loaded{ctx, module, k};
  return k;
}

// One region of a vsnap_digest_spans launch: digest_kernel.cu's DigestSpanDesc, field for field.
struct SpanDesc {
  uint64_t base, size, chunkSize, firstBlock, blocksPerChunk;
};
static_assert(sizeof(SpanDesc) == 40, "the kernel reads five 64-bit fields a region");

// A non-blocking stream, device scratch memory and two events, freed on every path.
class Launch {
 public:
  Launch(const std::shared_ptr<cuda::Context>& ctx, uint64_t scratchBytes) : cu_(cuda::api()) {
    ctx->makeCurrent();
    cuda::check(cu_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    if (scratchBytes) cuda::check(cu_.cuMemAlloc(&scratch_, scratchBytes), "cuMemAlloc (digest partials)");
    cuda::check(cu_.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
    cuda::check(cu_.cuEventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
  }
  ~Launch() {
    if (stream_) cu_.cuStreamSynchronize(stream_);
    if (start_) cu_.cuEventDestroy(start_);
    if (stop_) cu_.cuEventDestroy(stop_);
    if (scratch_) cu_.cuMemFree(scratch_);
    if (stream_) cu_.cuStreamDestroy(stream_);
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  // Enqueues the kernel over [address, +size); partial sums land in scratch.
  void digest(CUfunction fn, uint64_t address, uint64_t size, uint64_t chunkSize, unsigned blocksPerChunk, uint64_t blocks) {
    CUdeviceptr base = address, partials = scratch_;
    unsigned long long sz = size, cs = chunkSize, span = kSpanBytes;
    void* args[] = {&base, &sz, &cs, &blocksPerChunk, &span, &partials};
    cuda::check(cu_.cuLaunchKernel(fn, static_cast<unsigned>(blocks), 1, 1, kThreads, 1, 1, 0, stream_, args, nullptr),
                "cuLaunchKernel (digest)");
  }
  // Enqueues one launch over every region of `table` (uploaded to scratch after the partials).
  void digestSpans(CUfunction fn, const std::vector<SpanDesc>& table, uint64_t blocks) {
    CUdeviceptr spans = scratch_ + blocks * 16, partials = scratch_;
    cuda::check(cu_.cuMemcpyHtoDAsync(spans, table.data(), table.size() * sizeof(SpanDesc), stream_), "cuMemcpyHtoDAsync (digest regions)");
    unsigned count = static_cast<unsigned>(table.size());
    unsigned long long span = kSpanBytes;
    void* args[] = {&spans, &count, &span, &partials};
    cuda::check(cu_.cuLaunchKernel(fn, static_cast<unsigned>(blocks), 1, 1, kThreads, 1, 1, 0, stream_, args, nullptr),
                "cuLaunchKernel (digest)");
  }
  float timed(const std::function<void()>& work) {
    cuda::check(cu_.cuEventRecord(start_, stream_), "cuEventRecord");
    work();
    cuda::check(cu_.cuEventRecord(stop_, stream_), "cuEventRecord");
    cuda::check(cu_.cuEventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    cuda::check(cu_.cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    return ms;
  }
  void fetch(void* dst, uint64_t bytes) {
    cuda::check(cu_.cuMemcpyDtoHAsync(dst, scratch_, bytes, stream_), "cuMemcpyDtoHAsync (digest partials)");
    cuda::check(cu_.cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }
  CUstream stream() const { return stream_; }

 private:
  const cuda::Api& cu_;
  CUstream stream_ = nullptr;
  CUdeviceptr scratch_ = 0;
  CUevent start_ = nullptr, stop_ = nullptr;
};

void checkChunking(uint64_t size, uint64_t chunkSize) {
  if (chunkSize == 0 || chunkSize % 16 != 0 || chunkSize > (1ull << 30)) {
    throwInvalid("digest chunk size must be a positive multiple of 16 up to 1 GiB, not " + std::to_string(chunkSize));
  }
}

struct Plan {
  uint64_t chunks;
  unsigned blocksPerChunk;
  uint64_t blocks;
};

Plan plan(uint64_t size, uint64_t chunkSize) {
  Plan p;
  p.chunks = (size + chunkSize - 1) / chunkSize;
  // A region shorter than a chunk gets only the blocks its bytes need.
  p.blocksPerChunk = static_cast<unsigned>((std::min(chunkSize, size) + kSpanBytes - 1) / kSpanBytes);
  p.blocks = p.chunks * p.blocksPerChunk;
  if (p.blocks > 0x7fffffffull) throwInvalid("region too large for one digest launch");
  return p;
}

}  // namespace

std::string Hash128::hex() const {
  char out[33];
  std::snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(h[0]), static_cast<unsigned long long>(h[1]));
  return out;
}

namespace {

// One chunk on the CPU. Sums are order-free, so four independent accumulators let the
// compiler vectorise (an AVX2 clone is picked at load time where the CPU has it).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
vsnap_gd1::Acc absorbWords(const unsigned char* p, uint64_t words, uint64_t first) {
  vsnap_gd1::Acc lanes[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  uint64_t j = 0;
  for (; j + 4 <= words; j += 4) {
    for (int k = 0; k < 4; k++) {
      uint64_t w;
      std::memcpy(&w, p + 8 * (j + k), 8);  // little-endian hosts only (x86-64, arm64)
      vsnap_gd1::absorb(lanes[k], w, static_cast<uint32_t>(first + j + k));
    }
  }
  for (; j < words; j++) {
    uint64_t w;
    std::memcpy(&w, p + 8 * j, 8);
    vsnap_gd1::absorb(lanes[0], w, static_cast<uint32_t>(first + j));
  }
  for (int k = 1; k < 4; k++) vsnap_gd1::merge(lanes[0], lanes[k]);
  return lanes[0];
}

}  // namespace

std::vector<Hash128> digestHost(const unsigned char* data, uint64_t size, uint64_t chunkSize) {
  checkChunking(size, chunkSize);
  uint64_t chunks = (size + chunkSize - 1) / chunkSize;
  std::vector<Hash128> out(chunks);
  // Chunks are independent: large regions are spread over a few threads.
  unsigned threads = static_cast<unsigned>(std::min<uint64_t>({chunks, std::max(1u, std::thread::hardware_concurrency()), 8, size / (64ull << 20) + 1}));
  std::atomic<uint64_t> next{0};
  auto work = [&] {
    ChunkDigester one;
    for (uint64_t c; (c = next.fetch_add(1)) < chunks;) {
      one.reset();
      one.update(data + c * chunkSize, std::min(chunkSize, size - c * chunkSize));
      out[c] = one.finish();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; t++) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return out;
}

void ChunkDigester::update(const unsigned char* p, uint64_t length) {
  if (length_ % 8 != 0) throwInvalid("a chunk digest's pieces, all but the last, are multiples of 8 bytes");
  uint64_t words = length / 8;
  uint64_t first = length_ / 8;
  vsnap_gd1::Acc acc = absorbWords(p, words, first);
  if (length % 8) {
    vsnap_gd1::absorb(acc, vsnap_gd1::tailWord(p + 8 * words, static_cast<uint32_t>(length % 8)), static_cast<uint32_t>(first + words));
  }
  vsnap_gd1::merge(acc_, acc);
  length_ += length;
}

Hash128 ChunkDigester::finish() const {
  Hash128 h;
  vsnap_gd1::finish(acc_, length_, h.h);
  return h;
}

void ChunkDigester::reset() {
  acc_ = vsnap_gd1::Acc{0, 0};
  length_ = 0;
}

std::vector<std::vector<Hash128>> digestDevice(const std::shared_ptr<cuda::Context>& ctx, const std::vector<DeviceSpan>& spans,
                                               float* kernelMs) {
  std::vector<Plan> plans;
  uint64_t blocks = 0;
  for (const auto& s : spans) {
    checkChunking(s.size, s.chunkSize);
    if (s.address % 16 != 0) throwInvalid("device digest needs 16-byte aligned memory");
    plans.push_back(plan(s.size, s.chunkSize));
    blocks += plans.back().blocks;
  }
  std::vector<std::vector<Hash128>> out(spans.size());
  if (blocks == 0) return out;
  ctx->makeCurrent();
  Kernels kernels = kernelsFor(ctx);
  // Every span in one launch, each block finding its span in a table, into one scratch buffer;
  // then one copy back and one wait. One launch a span ran a 4 MiB region on four blocks, one
  // after the other: thousands of small regions took longer than the bytes.
  std::vector<SpanDesc> table;
  uint64_t first = 0;
  for (size_t i = 0; i < spans.size(); i++) {
    if (plans[i].blocks) table.push_back({spans[i].address, spans[i].size, spans[i].chunkSize, first, plans[i].blocksPerChunk});
    first += plans[i].blocks;
  }
  if (blocks > 0x7fffffffull || table.size() > 0xffffffffull) throwInvalid("too many regions for one digest launch");
  Launch launch(ctx, blocks * 16 + table.size() * sizeof(SpanDesc));
  float ms = launch.timed([&] { launch.digestSpans(kernels.spans, table, blocks); });
  if (kernelMs) *kernelMs = ms;
  std::vector<uint64_t> partials(2 * blocks);
  launch.fetch(partials.data(), partials.size() * sizeof(uint64_t));
  uint64_t at = 0;
  for (size_t i = 0; i < spans.size(); i++) {
    const Plan& p = plans[i];
    out[i].resize(p.chunks);
    for (uint64_t c = 0; c < p.chunks; c++) {
      vsnap_gd1::Acc acc{0, 0};
      for (uint64_t b = at + c * p.blocksPerChunk; b < at + (c + 1) * p.blocksPerChunk; b++) {
        vsnap_gd1::merge(acc, vsnap_gd1::Acc{partials[2 * b], partials[2 * b + 1]});
      }
      vsnap_gd1::finish(acc, std::min(spans[i].chunkSize, spans[i].size - c * spans[i].chunkSize), out[i][c].h);
    }
    at += p.blocks;
  }
  return out;
}

BenchTimes benchDevice(const std::shared_ptr<cuda::Context>& ctx, uint64_t src, uint64_t dst, uint64_t size,
                       uint64_t chunkSize, int repeats) {
  checkChunking(size, chunkSize);
  Plan p = plan(size, chunkSize);
  ctx->makeCurrent();
  CUfunction fn = kernelsFor(ctx).chunks;
  Launch launch(ctx, p.blocks * 16);
  const cuda::Api& cu = cuda::api();
  BenchTimes t;
  for (int i = 0; i < repeats; i++) {
    t.digestMs.push_back(launch.timed([&] { launch.digest(fn, src, size, chunkSize, p.blocksPerChunk, p.blocks); }));
    t.copyMs.push_back(launch.timed([&] { cuda::check(cu.cuMemcpyDtoDAsync(dst, src, size, launch.stream()), "cuMemcpyDtoDAsync"); }));
  }
  return t;
}

}  // namespace vsnap::digest
