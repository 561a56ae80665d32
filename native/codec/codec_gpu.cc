#include "codec/codec_gpu.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "common/error.h"
#include "cuda/context.h"
#include "cuda/driver.h"

namespace vsnap::codec {
namespace {

#include "codec/codec_kernel.inc"

using namespace vsnap_c1;

// codec_kernel.cu's Params, field for field.
struct Params {
  unsigned long long elems, tableOff, blockOffOff, codesOff, restOff, tailOff, excOff, tailBytes, exceptionCount;
  unsigned int blockCount, width;
};
static_assert(sizeof(Params) == 80, "the kernels read nine 64-bit and two 32-bit fields");

Params paramsOf(const Layout& l, uint64_t exceptionCount) {
  return Params{l.elems, l.tableOff, l.blockOffOff, l.codesOff, l.restOff, l.tailOff, l.excOff, l.tailBytes, exceptionCount, l.blockCount, l.width};
}

struct Kernels {
  CUfunction decode[7] = {}, hist[7] = {}, encode[7] = {}, exceptions[7] = {};
  CUfunction offsets = nullptr;
};
struct Loaded {
  std::weak_ptr<cuda::Context> ctx;
  CUmodule module = nullptr;
  Kernels kernels;
};
std::mutex gMutex;
std::map<int, Loaded> gLoaded;

// The kernels, loaded once per live context (a context's modules go with it).
const Kernels& kernelsFor(const std::shared_ptr<cuda::Context>& ctx) {
  std::lock_guard<std::mutex> lock(gMutex);
  Loaded& l = gLoaded[ctx->ordinal()];
  if (l.ctx.lock() == ctx && l.kernels.offsets) return l.kernels;
  const cuda::Api& cu = cuda::api();
  ctx->makeCurrent();
  CUmodule module = nullptr;
  cuda::check(cu.cuModuleLoadData(&module, kCodecFatbin), "cuModuleLoadData (codec kernels)");
  Kernels k;
  auto get = [&](CUfunction* fn, const std::string& name) {
    CUresult r = cu.cuModuleGetFunction(fn, module, name.c_str());
    if (r != CUDA_SUCCESS) {
      cu.cuModuleUnload(module);
      cuda::check(r, ("cuModuleGetFunction (" + name + ")").c_str());
    }
  };
  for (int kind = kBytes; kind <= kE5m2; kind++) {
    get(&k.decode[kind], "vsc_decode_" + std::to_string(kind));
    get(&k.hist[kind], "vsc_hist_" + std::to_string(kind));
    get(&k.encode[kind], "vsc_encode_" + std::to_string(kind));
    get(&k.exceptions[kind], "vsc_exceptions_" + std::to_string(kind));
  }
  get(&k.offsets, "vsc_offsets");
  l = Loaded{ctx, module, k};
  return l.kernels;
}

void launch(CUfunction fn, unsigned blocks, unsigned threads, CUstream stream, void** args, const char* what) {
  if (blocks == 0) return;
  cuda::check(cuda::api().cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr), what);
}

void checkAligned(CUdeviceptr p, const char* what) {
  if (p % 16) throwInvalid(std::string("codec: ") + what + " must be 16-byte aligned");
}

// Device memory, a stream and two events for the host-to-host helpers, freed on every path.
class Session {
 public:
  explicit Session(int device) : ctx_(cuda::acquireContext(device)), cu_(cuda::api()) {
    ctx_->makeCurrent();
    cuda::check(cu_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    cuda::check(cu_.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
    cuda::check(cu_.cuEventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
  }
  ~Session() {
    ctx_->makeCurrent();
    if (stream_) cu_.cuStreamSynchronize(stream_);
    for (CUdeviceptr p : allocs_) cu_.cuMemFree(p);
    if (start_) cu_.cuEventDestroy(start_);
    if (stop_) cu_.cuEventDestroy(stop_);
    if (stream_) cu_.cuStreamDestroy(stream_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  CUdeviceptr alloc(uint64_t bytes) {
    CUdeviceptr p = 0;
    cuda::check(cu_.cuMemAlloc(&p, std::max<uint64_t>(bytes, 16)), "cuMemAlloc (codec)");
    allocs_.push_back(p);
    return p;
  }
  void upload(CUdeviceptr dst, const void* src, uint64_t bytes) {
    if (bytes) cuda::check(cu_.cuMemcpyHtoDAsync(dst, src, bytes, stream_), "cuMemcpyHtoDAsync (codec)");
    sync();
  }
  void download(void* dst, CUdeviceptr src, uint64_t bytes) {
    if (bytes) cuda::check(cu_.cuMemcpyDtoHAsync(dst, src, bytes, stream_), "cuMemcpyDtoHAsync (codec)");
    sync();
  }
  void sync() { cuda::check(cu_.cuStreamSynchronize(stream_), "cuStreamSynchronize (codec)"); }
  template <class Fn>
  float timed(Fn&& work) {
    cuda::check(cu_.cuEventRecord(start_, stream_), "cuEventRecord");
    work();
    cuda::check(cu_.cuEventRecord(stop_, stream_), "cuEventRecord");
    cuda::check(cu_.cuEventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    cuda::check(cu_.cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    return ms;
  }
  const std::shared_ptr<cuda::Context>& ctx() const { return ctx_; }
  CUstream stream() const { return stream_; }

 private:
  std::shared_ptr<cuda::Context> ctx_;
  const cuda::Api& cu_;
  CUstream stream_ = nullptr;
  CUevent start_ = nullptr, stop_ = nullptr;
  std::vector<CUdeviceptr> allocs_;
};

void checkErrors(Session& s, CUdeviceptr errors, bool decoding) {
  uint32_t flags = 0;
  s.download(&flags, errors, 4);
  if (flags == 0) return;
  if (decoding) corrupt("a block's escapes disagree with its block table (GPU decode)");
  throw NativeError("E_INTERNAL", "GPU codec encode: the exception list did not add up (flags " + std::to_string(flags) + ")");
}

}  // namespace

uint64_t encodeScratchBytes(uint64_t rawSize) { return 4096 + 4 * ((rawSize + kBlockElems - 1) / kBlockElems); }

void enqueueDecode(const std::shared_ptr<cuda::Context>& ctx, CUstream stream, const Header& h, CUdeviceptr src, CUdeviceptr dst,
                   CUdeviceptr errors) {
  checkAligned(src, "coded source");
  checkAligned(dst, "decode target");
  ctx->makeCurrent();
  const Kernels& k = kernelsFor(ctx);
  if (h.mode == kModeRaw) {
    if (h.rawSize) cuda::check(cuda::api().cuMemcpyDtoDAsync(dst, src + kHeaderBytes, h.rawSize, stream), "cuMemcpyDtoDAsync (raw chunk)");
    return;
  }
  Params p = paramsOf(h.layout, h.exceptionCount);
  void* args[] = {&src, &dst, &p, &errors};
  launch(k.decode[h.kind], h.layout.blockCount, kThreads, stream, args, "cuLaunchKernel (codec decode)");
}

Choice encodeDevice(const std::shared_ptr<cuda::Context>& ctx, CUstream stream, CUdeviceptr src, uint64_t rawSize, uint32_t hintKind,
                    CUdeviceptr dst, CUdeviceptr scratch) {
  checkAligned(src, "encode source");
  checkAligned(dst, "coded target");
  checkAligned(scratch, "scratch");
  if (hintKind != 0 && !kindValid(hintKind)) throwInvalid("codec element kind must be 1..6, not " + std::to_string(hintKind));
  ctx->makeCurrent();
  const cuda::Api& cu = cuda::api();
  const Kernels& k = kernelsFor(ctx);
  const uint32_t histKind = hintKind ? hintKind : uint32_t{kBytes};
  CUdeviceptr hist = scratch, codeOf = scratch + 2048, errors = scratch + 2304, counts = scratch + 2560;
  static const uint8_t zeros[2320] = {};
  uint32_t hostHist[512] = {};
  if (rawSize <= kMaxPlanesRaw && rawSize) {
    cuda::check(cu.cuMemcpyHtoDAsync(hist, zeros, sizeof zeros, stream), "cuMemcpyHtoDAsync (codec histogram)");
    unsigned long long size = rawSize;
    void* args[] = {&src, &size, &hist};
    unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(1024, ((rawSize + 15) / 16 + kThreads - 1) / kThreads));
    launch(k.hist[histKind], blocks, kThreads, stream, args, "cuLaunchKernel (codec histogram)");
    cuda::check(cu.cuMemcpyDtoHAsync(hostHist, hist, sizeof hostHist, stream), "cuMemcpyDtoHAsync (codec histogram)");
    cuda::check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize (codec histogram)");
  }
  uint64_t kindHist[256], byteHist[256];
  for (int i = 0; i < 256; i++) kindHist[i] = hostHist[i], byteHist[i] = hostHist[256 + i];
  Choice c = choose(hintKind, rawSize, kindHist, byteHist);
  // the header and table (host-written, like the CPU encoder's)
  std::vector<uint8_t> head(kHeaderBytes + 256 + 16, 0);
  writeHeader(c, rawSize, head.data());
  if (c.mode == kModeRaw) {
    cuda::check(cu.cuMemcpyHtoDAsync(dst, head.data(), kHeaderBytes, stream), "cuMemcpyHtoDAsync (codec header)");
    if (rawSize) cuda::check(cu.cuMemcpyDtoDAsync(dst + kHeaderBytes, src, rawSize, stream), "cuMemcpyDtoDAsync (raw chunk)");
    cuda::check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize (codec encode)");
    return c;
  }
  Layout l = layoutOf(c.kind, rawSize, c.width, c.exceptionCount);
  uint8_t map[256];
  codeMap(c, map);
  cuda::check(cu.cuMemcpyHtoDAsync(dst, head.data(), l.blockOffOff, stream), "cuMemcpyHtoDAsync (codec header)");
  cuda::check(cu.cuMemcpyHtoDAsync(codeOf, map, 256, stream), "cuMemcpyHtoDAsync (codec map)");
  cuda::check(cu.cuMemcpyHtoDAsync(errors, zeros, 16, stream), "cuMemcpyHtoDAsync (codec errors)");
  Params p = paramsOf(l, c.exceptionCount);
  void* encodeArgs[] = {&src, &dst, &p, &codeOf, &counts};
  launch(k.encode[c.kind], l.blockCount, kThreads, stream, encodeArgs, "cuLaunchKernel (codec encode)");
  void* offsetArgs[] = {&counts, &dst, &p, &errors};
  launch(k.offsets, 1, 1024, stream, offsetArgs, "cuLaunchKernel (codec offsets)");
  void* excArgs[] = {&src, &dst, &p, &codeOf, &errors};
  launch(k.exceptions[c.kind], l.blockCount, kThreads, stream, excArgs, "cuLaunchKernel (codec exceptions)");
  uint32_t flags = 0;
  cuda::check(cu.cuMemcpyDtoHAsync(&flags, errors, 4, stream), "cuMemcpyDtoHAsync (codec errors)");
  cuda::check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize (codec encode)");
  if (flags) throw NativeError("E_INTERNAL", "GPU codec encode: the exception list did not add up (flags " + std::to_string(flags) + ")");
  return c;
}

DeviceResult decodeThroughDevice(int device, const uint8_t* coded, uint64_t codedSize, uint64_t rawSize) {
  Header h = parse(coded, codedSize, rawSize);  // before anything reaches the device
  Session s(device);
  CUdeviceptr src = s.alloc(codedSize), dst = s.alloc(rawSize), errors = s.alloc(kDecodeScratchBytes);
  static const uint8_t zeros[16] = {};
  s.upload(src, coded, codedSize);
  s.upload(errors, zeros, 16);
  DeviceResult r;
  kernelsFor(s.ctx());  // loaded before the clock: a context per call loads its module again
  r.kernelMs = s.timed([&] { enqueueDecode(s.ctx(), s.stream(), h, src, dst, errors); });
  checkErrors(s, errors, true);
  r.bytes.resize(rawSize);
  s.download(r.bytes.data(), dst, rawSize);
  return r;
}

DeviceResult encodeThroughDevice(int device, const uint8_t* data, uint64_t size, uint32_t hintKind) {
  Session s(device);
  CUdeviceptr src = s.alloc(size), dst = s.alloc(size + kHeaderBytes), scratch = s.alloc(encodeScratchBytes(size));
  s.upload(src, data, size);
  DeviceResult r;
  Choice c;
  kernelsFor(s.ctx());
  r.kernelMs = s.timed([&] { c = encodeDevice(s.ctx(), s.stream(), src, size, hintKind, dst, scratch); });
  r.bytes.resize(c.codedSize);
  s.download(r.bytes.data(), dst, c.codedSize);
  return r;
}

}  // namespace vsnap::codec
