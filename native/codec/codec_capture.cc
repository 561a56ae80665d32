#include "codec/codec_capture.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "codec/codec.h"
#include "codec/codec_gpu.h"
#include "common/error.h"
#include "common/fault.h"
#include "cuda/context.h"
#include "cuda/driver.h"
#include "cuda/vmm.h"

namespace vsnap::codec {
namespace {

uint64_t round16(uint64_t n) { return (n + 15) / 16 * 16; }

// One GPU's streams, events and scratch (two coded slots and the encoder's work area), freed on
// every path after its streams are done.
class EncodeLane {
 public:
  EncodeLane(std::shared_ptr<cuda::Context> ctx, uint64_t maxChunk) : ctx_(std::move(ctx)), cu_(cuda::api()) {
    try {
      ctx_->makeCurrent();
      const uint64_t slotBytes = round16(maxChunk + vsnap_c1::kHeaderBytes);
      scratchBytes = 2 * slotBytes + round16(encodeScratchBytes(maxChunk));
      CUresult r = fault::hit(fault::Point::CodecScratch) ? CUDA_ERROR_OUT_OF_MEMORY : cu_.cuMemAlloc(&scratch, scratchBytes);
      cuda::check(r, "cuMemAlloc (codec capture scratch)");
      slot[0] = scratch;
      slot[1] = scratch + slotBytes;
      work = scratch + 2 * slotBytes;
      cuda::check(cu_.cuStreamCreate(&encode, CU_STREAM_NON_BLOCKING), "cuStreamCreate (codec capture)");
      cuda::check(cu_.cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING), "cuStreamCreate (codec capture)");
      for (int s = 0; s < 2; s++) {
        cuda::check(cu_.cuEventCreate(&copied[s], CU_EVENT_DISABLE_TIMING), "cuEventCreate (codec capture)");
        cuda::check(cu_.cuEventRecord(copied[s], copy), "cuEventRecord (codec capture)");
      }
    } catch (...) {
      release();  // a constructor that throws gets no destructor
      throw;
    }
  }
  ~EncodeLane() { release(); }
  EncodeLane(const EncodeLane&) = delete;
  EncodeLane& operator=(const EncodeLane&) = delete;

  void finish() {
    ctx_->makeCurrent();
    cuda::check(cu_.cuStreamSynchronize(encode), "cuStreamSynchronize (codec capture encode)");
    cuda::check(cu_.cuStreamSynchronize(copy), "cuStreamSynchronize (codec capture copy)");
  }

  // Waits for the streams, then frees what was made (idempotent).
  void release() {
    ctx_->makeCurrent();
    if (encode) cu_.cuStreamSynchronize(encode);
    if (copy) cu_.cuStreamSynchronize(copy);
    if (scratch) cu_.cuMemFree(scratch);
    scratch = 0;
    for (int s = 0; s < 2; s++) {
      if (copied[s]) cu_.cuEventDestroy(copied[s]);
      copied[s] = nullptr;
    }
    if (encode) cu_.cuStreamDestroy(encode);
    if (copy) cu_.cuStreamDestroy(copy);
    encode = copy = nullptr;
  }

  std::shared_ptr<cuda::Context> ctx_;
  const cuda::Api& cu_;
  CUstream encode = nullptr, copy = nullptr;
  CUevent copied[2] = {};
  CUdeviceptr scratch = 0, slot[2] = {}, work = 0;
  uint64_t scratchBytes = 0;
  uint64_t next = 0;  // this GPU's chunks encoded so far (its slot)
};

}  // namespace

CaptureHeldResult captureHeld(char* host, uint64_t begin, uint64_t limit, std::vector<CaptureSource>& sources) {
  const auto started = std::chrono::steady_clock::now();
  // Every source checked, and each GPU's scratch sized for its largest chunk, before anything is issued.
  std::map<int, std::pair<std::shared_ptr<cuda::Context>, uint64_t>> perDevice;
  for (size_t t = 0; t < sources.size(); t++) {
    const CaptureSource& s = sources[t];
    auto mapping = s.region->deviceMapping();
    if (!mapping) throwInvalid("codec capture: source " + std::to_string(t) + " is not device memory");
    if (s.chunkSize == 0 || s.chunkSize % 16) throwInvalid("codec capture: the chunk size must be a positive multiple of 16");
    if (s.hintKind > vsnap_c1::kE5m2) throwInvalid("codec capture: kind must be 0..6, not " + std::to_string(s.hintKind));
    if (mapping->address() % 16) throwInvalid("codec capture: a source must be 16-byte aligned");
    auto& need = perDevice[mapping->device()];
    need.first = mapping->context();
    need.second = std::max(need.second, std::min(s.chunkSize, s.region->size()));
  }
  std::map<int, std::unique_ptr<EncodeLane>> lanes;
  CaptureHeldResult result;
  for (auto& [device, need] : perDevice) {
    lanes[device] = std::make_unique<EncodeLane>(need.first, std::max<uint64_t>(need.second, 16));
    result.scratchBytes = std::max(result.scratchBytes, lanes[device]->scratchBytes);
  }
  const cuda::Api& cu = cuda::api();
  uint64_t cursor = round16(begin);
  result.chunks.resize(sources.size());
  for (size_t t = 0; t < sources.size(); t++) {
    const CaptureSource& s = sources[t];
    auto mapping = s.region->deviceMapping();
    EncodeLane& lane = *lanes.at(mapping->device());
    lane.ctx_->makeCurrent();
    const uint64_t size = s.region->size();
    for (uint64_t off = 0; off < size; off += s.chunkSize) {
      const uint64_t raw = std::min(s.chunkSize, size - off);
      const int slot = static_cast<int>(lane.next++ % 2);
      const CUdeviceptr src = mapping->address() + off;
      // The slot is free once the copy that read it is done; the encode waits for that on the GPU
      // (encodeDevice returns only when its stream is done), while the other slot's copy runs.
      cuda::check(cu.cuStreamWaitEvent(lane.encode, lane.copied[slot], 0), "cuStreamWaitEvent (codec capture)");
      const Choice c = encodeDevice(lane.ctx_, lane.encode, src, raw, s.hintKind, lane.slot[slot], lane.work);
      const bool coded = c.codedSize < raw;
      const uint64_t held = coded ? c.codedSize : raw;
      if (cursor > limit || held > limit - cursor) {
        throw NativeError("E_INTERNAL", "codec capture: the coded chunks pass the room reserved for them (" + std::to_string(limit - begin) + " bytes)");
      }
      if (held) cuda::check(cu.cuMemcpyDtoHAsync(host + cursor, coded ? lane.slot[slot] : src, held, lane.copy), "cuMemcpyDtoHAsync (codec capture)");
      cuda::check(cu.cuEventRecord(lane.copied[slot], lane.copy), "cuEventRecord (codec capture)");
      result.chunks[t].push_back({cursor, held, raw, coded});
      result.linkBytes += held;
      result.rawBytes += raw;
      cursor = round16(cursor + held);
    }
  }
  for (auto& [device, lane] : lanes) lane->finish();
  result.end = cursor;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace vsnap::codec
