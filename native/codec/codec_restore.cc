#include "codec/codec_restore.h"

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

// written: found by the kernel, after it wrote into the target.
[[noreturn]] void corruptAt(const std::string& reason, size_t target, size_t chunk, bool written = false) {
  throw NativeError("E_CODEC_CORRUPT", "coded chunk " + std::to_string(chunk) + " is damaged: " + reason,
                    {{"reason", reason}, {"target", static_cast<int64_t>(target)}, {"chunk", static_cast<int64_t>(chunk)}, {"written", written}});
}

// One GPU's streams, events and scratch, freed on every path (after its streams are done). The
// scratch is allocated first: a card without room for it fails here, before anything is made or issued.
class DeviceLane {
 public:
  DeviceLane(std::shared_ptr<cuda::Context> ctx, uint64_t slotBytes, uint64_t errorWords) : ctx_(std::move(ctx)), cu_(cuda::api()) {
    try {
      ctx_->makeCurrent();
      scratchBytes = 2 * slotBytes + 16 * std::max<uint64_t>(errorWords, 1);
      CUresult r = fault::hit(fault::Point::CodecRestoreScratch) ? CUDA_ERROR_OUT_OF_MEMORY : cu_.cuMemAlloc(&scratch, scratchBytes);
      cuda::check(r, "cuMemAlloc (codec restore scratch)");
      slot[0] = scratch;
      slot[1] = scratch + slotBytes;
      errors = scratch + 2 * slotBytes;
      cuda::check(cu_.cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING), "cuStreamCreate (codec restore)");
      cuda::check(cu_.cuStreamCreate(&decode, CU_STREAM_NON_BLOCKING), "cuStreamCreate (codec restore)");
      for (int s = 0; s < 2; s++) {
        cuda::check(cu_.cuEventCreate(&landed[s], CU_EVENT_DISABLE_TIMING), "cuEventCreate (codec restore)");
        cuda::check(cu_.cuEventCreate(&freed[s], CU_EVENT_DISABLE_TIMING), "cuEventCreate (codec restore)");
        cuda::check(cu_.cuEventRecord(freed[s], decode), "cuEventRecord (codec restore)");
      }
      // on the decode stream: a non-blocking stream is not ordered after the legacy stream's memset
      cuda::check(cu_.cuMemsetD8Async(errors, 0, 16 * std::max<uint64_t>(errorWords, 1), decode), "cuMemsetD8Async (codec restore errors)");
    } catch (...) {
      release();  // a constructor that throws gets no destructor
      throw;
    }
  }
  ~DeviceLane() { release(); }
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  // Waits for the streams, then frees what was made (idempotent).
  void release() {
    ctx_->makeCurrent();
    if (copy) cu_.cuStreamSynchronize(copy);
    if (decode) cu_.cuStreamSynchronize(decode);
    if (scratch) cu_.cuMemFree(scratch);
    scratch = 0;
    for (int s = 0; s < 2; s++) {
      if (landed[s]) cu_.cuEventDestroy(landed[s]);
      if (freed[s]) cu_.cuEventDestroy(freed[s]);
      landed[s] = freed[s] = nullptr;
    }
    if (copy) cu_.cuStreamDestroy(copy);
    if (decode) cu_.cuStreamDestroy(decode);
    copy = decode = nullptr;
  }

  void finish() {
    ctx_->makeCurrent();
    cuda::check(cu_.cuStreamSynchronize(copy), "cuStreamSynchronize (codec restore copy)");
    cuda::check(cu_.cuStreamSynchronize(decode), "cuStreamSynchronize (codec restore decode)");
  }

  std::shared_ptr<cuda::Context> ctx_;
  const cuda::Api& cu_;
  CUstream copy = nullptr, decode = nullptr;
  CUevent landed[2] = {}, freed[2] = {};
  CUdeviceptr scratch = 0, slot[2] = {}, errors = 0;
  uint64_t scratchBytes = 0;
  uint64_t next = 0;  // this GPU's coded chunks issued so far (its slot and error word)
};

}  // namespace

HeldRestoreResult restoreHeld(const char* host, std::vector<HeldTarget>& targets) {
  const auto started = std::chrono::steady_clock::now();
  // Every header and table checked, and each GPU's scratch sized, before anything is issued.
  std::vector<std::vector<Header>> headers(targets.size());
  struct Need {
    std::shared_ptr<cuda::Context> ctx;
    uint64_t slotBytes = 16, coded = 0;
  };
  std::map<int, Need> perDevice;
  for (size_t t = 0; t < targets.size(); t++) {
    auto& target = targets[t];
    auto mapping = target.region->deviceMapping();
    if (!mapping) throwInvalid("codec restore: target " + std::to_string(t) + " is not device memory");
    auto& need = perDevice[mapping->device()];
    need.ctx = mapping->context();
    headers[t].resize(target.chunks.size());
    for (size_t i = 0; i < target.chunks.size(); i++) {
      const HeldChunk& c = target.chunks[i];
      if (c.dstOffset > target.region->size() || c.rawSize > target.region->size() - c.dstOffset) {
        throwInvalid("codec restore: chunk " + std::to_string(i) + " lies outside target " + std::to_string(t));
      }
      if (c.dstOffset % 16) throwInvalid("codec restore: chunk offsets must be 16-byte aligned");
      if (!c.coded) {
        if (c.held != c.rawSize) throwInvalid("codec restore: a raw chunk holds its raw size");
        continue;
      }
      try {
        headers[t][i] = parse(reinterpret_cast<const uint8_t*>(host + c.at), c.held, c.rawSize);
      } catch (const NativeError& e) {
        if (e.code() != "E_CODEC_CORRUPT") throw;
        auto r = e.details().find("reason");
        corruptAt(r != e.details().end() ? std::get<std::string>(r->second) : e.what(), t, i);
      }
      need.slotBytes = std::max(need.slotBytes, round16(c.held));
      need.coded++;
    }
  }
  std::map<int, std::unique_ptr<DeviceLane>> lanes;
  HeldRestoreResult result;
  for (auto& [device, need] : perDevice) {
    lanes[device] = std::make_unique<DeviceLane>(need.ctx, need.slotBytes, need.coded);
    result.scratchBytes = std::max(result.scratchBytes, lanes[device]->scratchBytes);
  }
  // Issue: slot s of a GPU takes its next coded chunk only once the decode that read it before is done.
  std::vector<std::vector<uint64_t>> errorWord(targets.size());
  const cuda::Api& cu = cuda::api();
  for (size_t t = 0; t < targets.size(); t++) {
    auto& target = targets[t];
    auto mapping = target.region->deviceMapping();
    DeviceLane& lane = *lanes.at(mapping->device());
    lane.ctx_->makeCurrent();
    errorWord[t].assign(target.chunks.size(), UINT64_MAX);
    for (size_t i = 0; i < target.chunks.size(); i++) {
      const HeldChunk& c = target.chunks[i];
      CUdeviceptr dst = mapping->address() + c.dstOffset;
      if (!c.coded) {
        if (c.rawSize) cuda::check(cu.cuMemcpyHtoDAsync(dst, host + c.at, c.rawSize, lane.copy), "cuMemcpyHtoDAsync (raw chunk)");
        result.linkBytes += c.rawSize;
        result.rawBytes += c.rawSize;
        continue;
      }
      const int s = static_cast<int>(lane.next % 2);
      const CUdeviceptr errors = lane.errors + 16 * lane.next;
      errorWord[t][i] = lane.next++;
      cuda::check(cu.cuStreamWaitEvent(lane.copy, lane.freed[s], 0), "cuStreamWaitEvent (codec restore)");
      cuda::check(cu.cuMemcpyHtoDAsync(lane.slot[s], host + c.at, c.held, lane.copy), "cuMemcpyHtoDAsync (coded chunk)");
      cuda::check(cu.cuEventRecord(lane.landed[s], lane.copy), "cuEventRecord (codec restore)");
      cuda::check(cu.cuStreamWaitEvent(lane.decode, lane.landed[s], 0), "cuStreamWaitEvent (codec restore)");
      enqueueDecode(lane.ctx_, lane.decode, headers[t][i], lane.slot[s], dst, errors);
      cuda::check(cu.cuEventRecord(lane.freed[s], lane.decode), "cuEventRecord (codec restore)");
      result.linkBytes += c.held;
      result.rawBytes += c.rawSize;
    }
  }
  // Wait, then read every GPU's error words: a block the kernel found inconsistent names its chunk.
  std::map<int, std::vector<uint32_t>> flags;
  for (auto& [device, lane] : lanes) {
    lane->finish();
    std::vector<uint32_t> words(4 * std::max<uint64_t>(lane->next, 1));
    cuda::check(cu.cuMemcpyDtoH(words.data(), lane->errors, words.size() * 4), "cuMemcpyDtoH (codec restore errors)");
    flags[device] = std::move(words);
  }
  for (size_t t = 0; t < targets.size(); t++) {
    const auto& words = flags.at(targets[t].region->deviceMapping()->device());
    for (size_t i = 0; i < errorWord[t].size(); i++) {
      if (errorWord[t][i] != UINT64_MAX && words[4 * errorWord[t][i]] != 0) corruptAt("a block's escapes disagree with its block table (GPU decode)", t, i, true);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace vsnap::codec
